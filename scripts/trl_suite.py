"""TRL's whole GRPOTrainer test file, run against grpokit: CI's guard (``.ci/run``, after ``make test``).

Runs ``../shared/trl_suite/run.sh grpokit`` (TRL's own test file with only its import line swapped; it is kept
beside the clone, never copied into the project) on the applicable set (no vision models, vLLM or liger-kernel)
and fails when a case named in ``tests/trl_suite_expected_pass.txt`` does not pass. That list is every case TRL
itself passes on this machine, less the named exceptions of docs/from_trl.md ("TRL's own test file").

    python scripts/trl_suite.py                 # the suite beside the clone, the venv's python
    python scripts/trl_suite.py --vlm           # and the VLM cases of tests/trl_suite_expected_pass_vlm.txt
    python scripts/trl_suite.py --junit X.xml   # only check an earlier run's junit file

``--vlm`` (or TRL_SUITE_VLM=1) first builds the VLM stand-ins (scripts/build_vlm_fixtures.py, into run.sh's
fixtures folder), runs the cases of the VLM list beside the applicable set and expects them to pass as well.
Exits 0 with a note when ``../shared/trl_suite`` is not there (a clone outside CI). Env: TRL_SUITE (the suite's
folder), PY (the python run.sh uses; default this one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = ROOT / "tests" / "trl_suite_expected_pass.txt"
EXPECTED_VLM = ROOT / "tests" / "trl_suite_expected_pass_vlm.txt"
APPLICABLE = "not vlm and not VLM and not vllm and not liger"


def expected_names(path: Path | None = None) -> list[str]:
    """The test names of the expected-pass list (one a line; blank lines and # comments skipped)."""
    lines = (line.strip() for line in (path or EXPECTED).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """{Class::test[param]: (passed | failed | error | skipped, the last line of its message)} of a junit file."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = ((child.get("message") or "").strip().splitlines() or [""])[-1][:300]
                break
        found[name] = (status, message)
    return found


def check(expected: list[str], found: dict[str, tuple[str, str]]) -> list[str]:
    """One line per expected case that did not pass (not run at all included); empty when all passed."""
    return [
        f"{found.get(name, ('not run', ''))[0]:8s} {name}: {found.get(name, ('', 'no such case in the run'))[1]}"
        for name in expected
        if found.get(name, ("not run",))[0] != "passed"
    ]


def keyword(name: str) -> str:
    """The -k term that selects one listed case: its name with its parameters (pytest's -k takes ``[``, ``/``, ``-``
    in a name and matches it as a substring, so ``test_train_vlm[...Gemma3...]`` is that case alone)."""
    return name.split("::")[-1]


def selection(vlm: list[str]) -> str:
    """run.sh's -k: the applicable set, or it and the listed VLM cases."""
    return APPLICABLE if not vlm else f"({APPLICABLE}) or " + " or ".join(dict.fromkeys(map(keyword, vlm)))


def build_vlm_fixtures(python: str, env: dict) -> None:
    """The VLM stand-ins, into run.sh's fixtures folder (its default: $TMPDIR/trl_suite_fixtures)."""
    subprocess.run([python, str(ROOT / "scripts" / "build_vlm_fixtures.py")], cwd=ROOT, env=env, check=True)


def run_suite(suite: Path, python: str, vlm: list[str] = ()) -> Path:
    """Run the applicable set (and the listed VLM cases) against grpokit; the junit file it wrote."""
    results = Path(tempfile.mkdtemp(prefix="trl_suite_results."))
    env = dict(os.environ, PY=python, RESULTS_DIR=str(results), TRL_SUITE=str(suite))
    if vlm:
        build_vlm_fixtures(python, env)
    subprocess.run([str(suite / "run.sh"), "grpokit", "-k", selection(vlm)], cwd=ROOT, env=env, check=False)
    files = sorted(results.glob("grpokit-*.xml"))
    if not files:
        sys.exit(f"trl_suite: {suite / 'run.sh'} wrote no junit file under {results}; see its output above.")
    return files[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path, help="check this junit file instead of running the suite")
    parser.add_argument("--vlm", action="store_true", help="also the VLM cases (tests/trl_suite_expected_pass_vlm.txt)")
    args = parser.parse_args(argv)
    vlm = expected_names(EXPECTED_VLM) if args.vlm or os.environ.get("TRL_SUITE_VLM") == "1" else []
    junit = args.junit
    if junit is None:
        suite = Path(os.environ.get("TRL_SUITE", ROOT.parent / "shared" / "trl_suite"))
        if not (suite / "run.sh").exists():
            print(f"trl_suite: {suite} is not beside the clone; TRL's GRPOTrainer suite not run.")
            return 0
        junit = run_suite(suite, os.environ.get("PY", sys.executable), vlm)
    expected = expected_names() + vlm
    found = outcomes(junit)
    failed = check(expected, found)
    passed = sum(status == "passed" for status, _ in found.values())
    extra = sorted(n for n, (status, _) in found.items() if status == "passed" and n not in set(expected))
    print(
        f"trl_suite: {passed} of {len(found)} cases passed ({junit}); {len(expected) - len(failed)} of the "
        f"{len(expected)} expected ({EXPECTED.relative_to(ROOT)}{' and the VLM list' if vlm else ''})."
    )
    if extra:
        print(f"trl_suite: {len(extra)} passing cases are not in the expected list (TRL fails them here, or new).")
    if failed:
        print(f"trl_suite: {len(failed)} expected case(s) did not pass:")
        print("\n".join(f"  {line}" for line in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
