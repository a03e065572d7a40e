"""scripts/trl_suite.py, CI's guard over TRL's GRPOTrainer suite: it fails on any expected case that did not pass
(failed, errored, skipped or not run at all), and reads run.sh's junit names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("trl_suite", ROOT / "scripts" / "trl_suite.py")
trl_suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trl_suite)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_grpo_trainer.TestGRPOTrainer" name="test_a" />
<testcase classname="tests.test_grpo_trainer.TestGRPOTrainer" name="test_b[x]">
<failure message="boom&#10;AssertionError: 1 != 2" /></testcase>
<testcase classname="tests.test_grpo_trainer.TestGRPOTrainer" name="test_c"><skipped message="needs CUDA" /></testcase>
<testcase classname="tests.test_grpo_trainer.TestOther" name="test_d" />
</testsuite></testsuites>"""


def test_check_names_every_expected_case_that_did_not_pass(tmp_path):
    (tmp_path / "r.xml").write_text(JUNIT)
    found = trl_suite.outcomes(tmp_path / "r.xml")
    assert found["TestGRPOTrainer::test_b[x]"] == ("failed", "AssertionError: 1 != 2")
    assert trl_suite.check(["TestGRPOTrainer::test_a", "TestOther::test_d"], found) == []
    failed = trl_suite.check(
        ["TestGRPOTrainer::test_a", "TestGRPOTrainer::test_b[x]", "TestGRPOTrainer::test_c", "TestGRPOTrainer::gone"],
        found,
    )
    assert [line.split()[0] for line in failed] == ["failed", "skipped", "not"]
    assert "gone: no such case in the run" in failed[2]


def test_main_checks_a_junit_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "r.xml").write_text(JUNIT)
    (tmp_path / "expected.txt").write_text("# a comment\nTestGRPOTrainer::test_a\n\nTestGRPOTrainer::test_b[x]\n")
    monkeypatch.setattr(trl_suite, "EXPECTED", tmp_path / "expected.txt")
    monkeypatch.setattr(trl_suite, "ROOT", tmp_path)
    assert trl_suite.main(["--junit", str(tmp_path / "r.xml")]) == 1
    out = capsys.readouterr().out
    assert "1 expected case(s) did not pass" in out and "test_b[x]" in out
    (tmp_path / "expected.txt").write_text("TestGRPOTrainer::test_a\n")
    assert trl_suite.main(["--junit", str(tmp_path / "r.xml")]) == 0


def test_the_project_list_is_unique_and_named_as_run_sh_reports():
    names = trl_suite.expected_names()
    assert len(names) == len(set(names)) and len(names) >= 100
    assert all("::" in n and n.split("::")[0].startswith("Test") for n in names)


def test_vlm_cases_widen_the_selection_by_name():
    vlm = [
        "TestGRPOTrainerVLM::test_train_vlm[trl-internal-testing/tiny-Gemma3ForConditionalGeneration]",
        "TestGRPOTrainerVLM::test_train_vlm[trl-internal-testing/tiny-Qwen3_5ForConditionalGeneration-NoThink]",
        "TestGRPOTrainerVLM::test_train_vlm_log_multimodal_false",
    ]
    assert trl_suite.selection([]) == trl_suite.APPLICABLE
    assert trl_suite.selection(vlm) == (
        f"({trl_suite.APPLICABLE}) or test_train_vlm[trl-internal-testing/tiny-Gemma3ForConditionalGeneration] or "
        "test_train_vlm[trl-internal-testing/tiny-Qwen3_5ForConditionalGeneration-NoThink] or "
        "test_train_vlm_log_multimodal_false"
    )
    assert all(n.startswith("TestGRPOTrainerVLM::") for n in trl_suite.expected_names(trl_suite.EXPECTED_VLM))
