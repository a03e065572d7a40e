"""Learning: the policy update (learner, its log-probs and optimizer), the reference copy, PPO's critic."""
