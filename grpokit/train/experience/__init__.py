"""Sampling: the rollout scheduler with its samplers and sources, dynamic sampling's rounds, tool rollouts, and
scoring, up to the Trajectory they hand to learning."""
