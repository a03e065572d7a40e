"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")."""

from __future__ import annotations


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples, drawn without replacement from n samples of
    which c are correct, is correct: 1 - C(n-c, k) / C(n, k).

    Computed in the numerically stable product form of the Codex paper,
    1 - prod_{i = n-c+1}^{n} (1 - k / i), which avoids huge binomial coefficients.
    Returns 1.0 when n - c < k (every draw of k contains a correct sample).
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong
