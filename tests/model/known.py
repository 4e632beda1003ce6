"""Known engine defects the model test steps around until they are fixed: each entry names
the regression test in test_found.py that reproduces it (xfail, strict). When the fix
lands that test passes, its marker goes, and so does the entry here.

`FUSEE_MODEL_STRICT=1` steps around nothing (to see what a fix left)."""

from __future__ import annotations

import os

KNOWN: dict[str, str] = {
    "concurrent-update-with-start": "test_update_with_start_twice_for_a_new_id_finds_no_handler",
    "wrong-type-signal": "test_a_signal_of_the_wrong_type_is_acknowledged",
    "update-stuck": "test_repeating_an_answered_update_on_a_stuck_run_answers",
    "deadline-child": "test_a_deadline_survives_a_child_result",
    "deadline-cas": "test_a_deadline_survives_continue_as_new",
    "update-with-start-ends": "test_update_with_start_of_a_run_that_ends_at_once_answers",
    "calls-waiting-for-code": "test_a_signal_to_a_run_waiting_for_code_after_a_clean_reopen",
    "checkpoint-wakeup": "test_a_run_parked_as_its_bucket_begins_wakes_after_a_crash",
    "stale-due": "test_a_run_that_ended_leaves_no_next_due",
    "waiting-for-code-resume": "test_a_run_waiting_for_code_resumes_when_its_code_is_back",
    "zombie-step-result": "test_an_abandoned_engine_records_nothing",
    "cancel-stuck": "test_a_cancel_of_a_stuck_run_is_recorded",
    "wait-hole": "test_a_wait_satisfied_by_a_kept_signal_is_recorded_after_a_recovery",
    "close-without-code": "test_a_run_ended_without_its_code_closes_its_children",
    "signal-stuck": "test_a_signal_to_a_stuck_run_is_recorded",
}

AVOID: dict[str, object] = {} if os.environ.get("FUSEE_MODEL_STRICT") else dict(KNOWN)
