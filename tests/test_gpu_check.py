"""tools/gpu_check.py's CPU-checkable pieces: the attention path read off HLO, the goals its
summary judges, and a part killed at its cap. The whole script's `run --smoke` takes
minutes on a busy 2-core machine, so it is a documented manual check (tools/gpu_check.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(scope="module")
def tools() -> Iterator[None]:
    """tools/ on sys.path, as when the script runs (it imports its siblings)."""
    sys.path.insert(0, str(TOOLS))
    yield
    sys.path.remove(str(TOOLS))


HLO = """
  %custom-call.3 = (bf16[8,16,4096,128]{3,2,1,0}, f32[8,16,4096]{2,1,0}, u8[0]{0})
  custom-call(%a, %b, %c), custom_call_target="__cudnn$fmhaSoftmax", api_version=API_VERSION_STATUS_RETURNING
  %custom-call.9 = custom-call(%d), custom_call_target="__cudnn$fmhaSoftmaxBackward"
  %cublas = custom-call(%e, %f), custom_call_target="__cublas$gemm"
"""


def test_attention_calls_reads_cudnn_from_hlo(tools: None) -> None:
    from gpu_check_parts import attention_calls

    got = attention_calls(HLO)
    assert got["attention"] == "cudnn"
    assert got["cudnn_calls"] == ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"]
    assert attention_calls(HLO.replace("__cudnn$fmha", "__other$"))["attention"] == "xla"


def train(losses: list[float], wait: float = 0.001, tps: float = 1000.0) -> dict:
    """A finished train part's figures."""
    return {
        "status": "ok",
        "losses": losses,
        "mfu": 0.5,
        "tokens_per_s": tps,
        "data_wait_frac": wait,
    }


def test_summary_judges_loss_loader_and_decode(tools: None) -> None:
    from gpu_check_report import summarize

    parts = {
        "train_b8_dots": train([10.37, 10.36, 10.40]),
        "train_fp32_check": train([10.371, 10.362, 10.39], wait=0.5),  # its wait is not judged
        "train_b4_none": train([10.0], tps=2000.0),
        "decode": {
            "status": "ok",
            "rows": [
                {"batch": 1, "decode_ratio": 1.2, "greedy_rows_equal_float32": "1/1"},
                {"batch": 32, "decode_ratio": 1.5, "greedy_rows_equal_float32": "31/32"},
            ],
        },
    }
    s = summarize(parts)
    assert s["loss_check"]["pass"] and s["loss_check"]["max_rel_diff"] < 1e-3
    assert s["best_setting"]["part"] == "train_b4_none"
    assert s["loader"] == {"max_data_wait_frac": 0.001, "pass": True}
    assert [(d["goal"], d["greedy_equal_pass"]) for d in s["decode"]] == [
        (True, True),
        (False, False),
    ]
    parts["train_fp32_check"]["losses"] = [10.6, 10.36, 10.40]  # 2% off: beyond bf16's band
    parts["train_b4_none"]["data_wait_frac"] = 0.02
    s = summarize(parts)
    assert not s["loss_check"]["pass"]
    assert not s["loader"]["pass"]


def test_part_killed_at_its_cap_is_recorded(tools: None, tmp_path: Path) -> None:
    import gpu_check

    results = gpu_check.Results(tmp_path, {"smoke": True})
    part = gpu_check.Part("sleeper", "no-such-kind", 0.3, {})
    got = gpu_check.run_child(part, 0.3, results, smoke=True)
    assert got["status"] == "timeout"
    assert got["error"] == "killed at its 0.3 s cap"
    assert json.loads((tmp_path / "results.json").read_text())["meta"] == {"smoke": True}
