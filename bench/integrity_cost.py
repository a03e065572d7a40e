"""What the run-folder checks cost: the checksum of a checkpoint file, the digest written with each step, and a
resume's check of the whole store. Prints `sha256_mb_per_s=...`, `step_digest_ms=...` and `check_store_s=...`.

The checkpoint manifest reads every file once after saving and once before resuming (``train/rundir/manifest.py``); each
stored step's rows are read back once for its digest; a resume recomputes the digest of every step it keeps
(``store/integrity.py``). Default store: 1,000 steps of 64 rollouts with 1,000-character completions (~90 MB).

    python bench/integrity_cost.py [--mb 512] [--steps 1000] [--rollouts 64]    # ~1 min, ~600 MB of temporary files
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from grpokit.store import RolloutRecord, RolloutStore
from grpokit.store.integrity import check_store
from grpokit.train.rundir.manifest import file_digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="size of the checksummed file")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rollouts", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        big = folder / "weights.bin"
        with open(big, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        file_digest(big)  # in the page cache, as a checkpoint just written is
        start = time.perf_counter()
        file_digest(big)
        print(f"sha256_mb_per_s={args.mb / (time.perf_counter() - start):.0f}")
        big.unlink()

        rows = [
            RolloutRecord(
                prompt_index=i // 8,
                completion_index=i % 8,
                prompt="p" * 200,
                completion="c" * 1000,
                prompt_tokens=50,
                completion_tokens=250,
                finish_reason="stop",
                rewards={"accuracy": 1.0},
                reward=1.0,
                advantage=0.5,
                policy_version=0,
                error=None,
            )
            for i in range(args.rollouts)
        ]
        digest_seconds = 0.0
        with RolloutStore(folder / "rollouts.sqlite") as store:
            for step in range(1, args.steps + 1):
                store.write_step(step, rows, {"kl": float(step), "entropy": 1.0})
                start = time.perf_counter()
                store.step_digest(step)
                digest_seconds += time.perf_counter() - start
        print(f"step_digest_ms={1000 * digest_seconds / args.steps:.2f}")
        size = (folder / "rollouts.sqlite").stat().st_size
        start = time.perf_counter()
        check_store(folder / "rollouts.sqlite", 1, args.steps, None, f"step-{args.steps}")
        print(f"check_store_s={time.perf_counter() - start:.1f} store_mb={size / 1e6:.0f}")


if __name__ == "__main__":
    main()
