"""`lemur-train plan`: the run's own steps compiled for TPU topologies on this CPU host
(libtpu's compiler, no TPU), the out-of-HBM refusal in one line, --fit, GPU estimates, and
every shipped config on its documented topology (marked `pod`: `make test` leaves them out,
`make test-pod` runs them; CI runs both).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from lemur.model.config import flops_per_token
from lemur.train import plan_fit, plan_targets
from lemur.train.cli import main
from lemur.train.config import CONFIGS_DIR, load_train_config
from lemur.train.plan import Memory
from lemur.train.plan_targets import GIB, parse_oom, parse_target

needs_libtpu = pytest.mark.skipif(
    not plan_targets.libtpu_available(), reason="libtpu not installed (pip install -e '.[dev]')"
)
# An oversized run: the tiny config with a 70B's widths (16 layers): ~15B parameters with
# Adam on 4 chips need ~65 GiB per chip; the compiler refuses it in seconds.
OVERSIZED = [
    *("--set", "model.overrides.d_model=8192", "--set", "model.overrides.d_ff=28672"),
    *("--set", "model.overrides.n_layers=16", "--set", "model.overrides.scan_layers=true"),
]


@pytest.fixture(autouse=True)
def _libtpu_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `plan` sets for itself, undone after each test (it runs in this process)."""
    for name, value in (
        ("JAX_PLATFORMS", "cpu"),
        ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
        ("TPU_ACCELERATOR_TYPE", "v4-8"),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
    ):
        monkeypatch.setenv(name, value)


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    """Run `lemur-train plan ARGV --json`: exit code, the JSON, stderr."""
    code = main(["plan", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


@needs_libtpu
@pytest.mark.parametrize("topology, chips, hbm_gib", [("v4-8", 4, 30.75), ("v5e-8", 8, 15.75)])
def test_tiny_compiles_for_a_tpu_and_fits(
    capsys, topology, chips, hbm_gib, tmp_path, monkeypatch
) -> None:
    # Away from the checkout: `tiny` names out/demo, whose vocabulary (once `make demo` has
    # built it) the plan takes, where the expected count below takes the config's.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LEMUR_PROGRESS_INTERVAL", "0.05")  # a log's heartbeat, made fast
    code, plan, err = plan_json(capsys, "tiny", "--topology", topology)
    assert code == 0
    # Without a terminal: what is compiled, a line every interval while it compiles, and
    # its wall time (#44 item 9).
    what = f"lemur-train plan: compiling the train and eval steps of tiny for {topology}"
    assert re.search(rf"^{what} \({chips} chips\), \d+s elapsed$", err, re.M), err
    assert re.search(rf"^{what} \({chips} chips\) done in \d+s$", err, re.M), err
    memory = plan["memory"]
    assert plan["devices"] == chips and plan["mesh"] == {"data": 1, "fsdp": chips, "tensor": 1}
    assert memory["fits"] and 0 < memory["peak"] < memory["hbm"]
    assert memory["hbm"] == pytest.approx(hbm_gib * GIB, rel=1e-3)
    assert memory["hbm_source"] == "the compiler's limit"
    assert memory["arguments"] > 0 and memory["eval_peak"] > 0
    # The model's own count: tokens x flops_per_token (8 x 128 tokens per step).
    per_token = flops_per_token(load_train_config("tiny").model.llama(), 128)
    assert plan["tokens_per_step"] == 1024 and plan["flops_per_step"] == per_token * 1024


@needs_libtpu
def test_oversized_config_exits_1_with_the_compilers_figures(capsys) -> None:
    code = main(["plan", "tiny", "--topology", "v4-8", *OVERSIZED])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    [line] = err.splitlines()
    assert "does not fit" in line and "GiB per device, 30.75 GiB usable (the compiler)" in line
    needed = float(line.split("needs ")[1].split(" GiB")[0])
    assert needed > 30.75


def test_fit_searches_cost_order_and_bisects_microbatches(capsys, monkeypatch) -> None:
    """The search's order, with the compiler replaced by a memory model (a real fitting
    compile takes 30-700 s here): peak = 100 GiB x recompute share / microbatches."""
    share = {"none": 4.0, "dots": 1.0, "full": 0.5}
    compiled: list[tuple[str, int]] = []

    def fake_compile(config, model, devices, hbm, with_eval=True):
        compiled.append((model.remat, config.batch.microbatches))
        peak = 100 * GIB * share[model.remat] / config.batch.microbatches
        return Memory(fits=peak <= hbm[0], peak=peak, hbm=hbm[0], hbm_source=hbm[1])

    monkeypatch.setattr(plan_targets, "libtpu_available", lambda: True)
    monkeypatch.setattr(plan_fit, "compile_memory", fake_compile)
    monkeypatch.setattr(plan_fit, "eval_memory_for", lambda *a: GIB)
    monkeypatch.setattr(plan_fit, "tpu_devices", lambda target: [None] * target.devices)
    monkeypatch.setattr(plan_fit, "chip_hbm", lambda target, devices: (30 * GIB, "test"))
    monkeypatch.setenv("LEMUR_PROGRESS_INTERVAL", "0.05")
    real_compile = fake_compile

    def slow_compile(*args, **kwargs):
        time.sleep(0.06)  # a compile of minutes, in a log file: a heartbeat line each interval
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(plan_fit, "compile_memory", slow_compile)
    # 64 windows on 4 chips: microbatches 1, 2, 4, 8, 16 keep whole windows per chip.
    argv = ["plan", "tiny", "--topology", "v4-8", "--fit", "--set", "batch.size=64"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    what = re.escape(
        "lemur-train plan: searching remat and microbatches of tiny for v4-8 (4 chips)"
    )
    assert re.search(rf"^{what}, \d+s elapsed$", err, re.M), err
    assert re.search(rf"^{what} done in \d+s$", err, re.M), err
    # none needs 400 GiB / microbatches: it fits from 16 (25 GiB). The largest count first,
    # then the bisection (4: 100 GiB, 8: 50); dots, which recomputes more, is never tried.
    assert compiled == [("none", 16), ("none", 4), ("none", 8)]
    assert out.splitlines()[-1].startswith(
        "fastest setting that fits: --set batch.microbatches=16 --set model.overrides.remat=none"
    )
    compiled.clear()
    share["none"] = 8.0  # now none never fits; dots does from 4 (25 GiB)
    assert main(argv) == 0
    assert compiled == [("none", 16), ("dots", 16), ("dots", 4), ("dots", 2)]
    share.update(none=99.0, dots=99.0, full=99.0)
    assert main(argv) == 1
    assert "nothing fits (3 compiles" in capsys.readouterr().err


@needs_libtpu
def test_a_pods_mesh_gives_each_host_one_block_of_rows() -> None:
    """jax.make_mesh put host 0's chips of a v4-512 at rows 0, 32, 256, 288: the trainer
    refused to start ("not one aligned block"); the mesh lists each host's chips together."""
    from lemur.train.batch import BatchLayout, HostSlice
    from lemur.train.state import make_run_mesh

    devices = plan_targets.tpu_devices(parse_target("v4-512"))
    mesh = make_run_mesh(load_train_config("lemur-70b"), devices)
    assert BatchLayout.on(mesh, 1024, 4096).host == HostSlice(index=0, count=64, rows=16)


def test_bad_topology_exits_2_listing_valid_names(capsys) -> None:
    assert main(["plan", "tiny", "--topology", "v4-9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lemur-train: --topology: unknown 'v4-9'; valid: v4-{8,16,")
    assert "v5e-{4,8,16,32,64,128,256}" in err and len(err.splitlines()) == 1


def test_topology_names_map_to_cloud_tpu_shapes() -> None:
    v4 = parse_target("v4-512")  # names count TensorCores: 256 chips
    assert (v4.chips, v4.shape, v4.chip.chip_config) == (256, "4x8x8", "megacore")
    v5e = parse_target("v5e-256")  # names count chips, 2D
    assert (v5e.chips, v5e.shape, v5e.chip.chip_config) == (256, "16x16", "default")
    assert parse_target("v5p-12288").shape == "16x16x24"
    assert parse_target("v6e-8", slices=2).devices == 16


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--slices", "0"], "--slices: must be >= 1, got 0"),
        (
            ["--slices", "1000000"],
            "--slices 1000000: v4-512 x 1,000,000 slices is 256,000,000 chips; a plan "
            "is bounded at 65,536 chips (tens of thousands: the largest Multislice run "
            "published, 50,944 v5e chips): fewer slices",
        ),
        (
            ["--slices", "257", "--topology", "v5e-256"],
            "--slices 257: v5e-256 x 257 slices is 65,792 chips; a plan is bounded at 65,536 "
            "chips (tens of thousands: the largest Multislice run published, 50,944 v5e "
            "chips): fewer slices",
        ),
        (["--set", "plan.slices=300", "--topology", "v5e-256"], "--slices 300: v5e-256 x 300"),
    ],
)
def test_slices_are_bounded_by_what_a_pod_can_be(capsys, monkeypatch, argv, said) -> None:
    """`--slices 0` planned one slice and `--slices 1000000` grew to 13.6 GB before it was
    killed: both one line, exit 2, before any device is made (#44 item 19)."""
    argv = argv if "--topology" in argv else [*argv, "--topology", "v4-512"]
    made = []  # no device is made: the check comes first (not timed: counted)
    from lemur.train import plan

    for module in (plan, plan_fit):
        monkeypatch.setattr(module, "tpu_devices", lambda target: made.append(target) or [])
    assert main(["plan", "lemur-70b", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lemur-train: {said}") and len(err.splitlines()) == 1, err
    assert made == []


def test_no_libtpu_exits_2_saying_how_to_install(capsys, monkeypatch) -> None:
    monkeypatch.setattr(plan_targets, "libtpu_available", lambda: False)
    assert main(["plan", "tiny", "--topology", "v4-8"]) == 2
    assert "pip install -e '.[dev]'" in capsys.readouterr().err


def test_a_libtpu_without_its_library_is_one_line(tmp_path) -> None:
    """A libtpu package that imports but whose shared library is missing (a broken or
    partial install) was a traceback of jax's plugin loader; now one line naming the file
    and the fix, exit 2 (#44 item 22)."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "site" / "libtpu"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import os\n"
        "def get_library_path():\n"
        "    return os.path.join(os.path.dirname(__file__), 'libtpu.so')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    env.pop("TPU_LIBRARY_PATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "lemur.train.cli", "plan", "tiny", "--topology", "v4-8"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("lemur-train")]
    assert (done.returncode, "Traceback" in done.stderr) == (2, False), done.stderr[-2000:]
    assert lines == [
        f"lemur-train: libtpu cannot be loaded from {fake / 'libtpu.so'}: no such file; "
        "reinstall it: pip install --force-reinstall -e '.[dev]' (see docs/train.md)"
    ], done.stderr[-2000:]


# A plan whose compile is interrupted the way 2 in 10 Ctrl-Cs were: the signal lands while
# the main thread runs a garbage-collection callback (JAX registers one), where Python
# reports the KeyboardInterrupt as "Exception ignored" and goes on.
INTERRUPTED_IN_GC = """
import gc, os, signal, sys, time
import lemur.train.plan as plan

def compile_interrupted(*args, **kwargs):
    def callback(phase, info):
        if phase == "start" and not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the signal is handled before the callback returns
    fired = []
    gc.callbacks.append(callback)
    gc.collect()
    time.sleep(1.0)
    print("the compile went on and the plan was printed")
    sys.exit(0)

plan.plan_tpu = compile_interrupted
from lemur.train.cli import main
sys.exit(main(["plan", "tiny", "--topology", "v4-8"]))
"""


@needs_libtpu
def test_ctrl_c_during_a_compile_is_never_swallowed(tmp_path) -> None:
    """Ctrl-C while the compile is in a JAX gc callback: exit 130 with one line, at once
    (it printed `Exception ignored in: <function _xla_gc_callback>`, then the plan, exit 0)
    (#44 item 22)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IN_GC],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith(("lemur-train", "Exc"))]
    assert (done.returncode, lines, done.stdout) == (130, ["lemur-train: interrupted"], "")


def test_out_of_hbm_message_parses() -> None:
    message = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (245.19G) exceeds available HBM (30.75G)."
    )
    assert parse_oom(message) == (245.19 * GIB, 30.75 * GIB)
    assert parse_oom("INTERNAL: something else") is None


def test_gpu_target_says_it_is_an_estimate(capsys) -> None:
    code, plan, err = plan_json(capsys, "lemur-70b", "--topology", "h100-8")
    assert code == 1  # 70B with Adam on 8 GPUs: ~128 GiB of state per GPU alone
    assert "jax-ml/jax#28376" in err and plan["estimate"] is True
    assert plan["memory"]["peak"] > 4 * 68e9 * 4 / 8
    code, plan, _ = plan_json(capsys, "tiny", "--topology", "h100-8")
    assert code == 0 and plan["memory"]["fits"] and plan["memory"]["hbm_source"] == "published HBM"


def planned_configs() -> list[str]:
    """The shipped configs that name the machine they are sized for."""
    names = sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
    return [n for n in names if load_train_config(n).plan.topology is not None]


def test_the_paper_config_is_sized_for_the_papers_pod() -> None:
    assert load_train_config("lemur-70b").plan.topology == "v4-512"
    assert {"lemur-70b-v5p", "llama3.1-8b-cpt", "qwen2.5-7b-cpt"} <= set(planned_configs())


@pytest.mark.pod
@needs_libtpu
@pytest.mark.parametrize("name", planned_configs())
def test_shipped_config_fits_its_documented_topology(name: str) -> None:
    """The config as shipped, its train step compiled for its pod (the eval step, smaller,
    is left out to keep the suite's time)."""
    from lemur.train.plan import plan_gpu, plan_tpu

    config = load_train_config(name)
    target = parse_target(config.plan.topology, config.plan.slices)
    if target.is_gpu:
        plan = plan_gpu(config, name, target, None)
    else:
        plan = plan_tpu(config, name, target, None, with_eval=False)
    assert plan.memory.fits, (name, plan.memory.peak / GIB)
    assert plan.memory.peak < plan.memory.hbm


def test_gpu_fit_searches_the_estimate(capsys) -> None:
    assert main(["plan", "qwen2.5-7b-cpt", "--topology", "h100-8", "--fit"]) == 0
    out, err = capsys.readouterr()
    assert "jax-ml/jax#28376" in err.splitlines()[0]
    last = out.splitlines()[-1]
    assert last.startswith("fastest setting that fits: --set batch.microbatches=")
    chosen = int(last.split("microbatches=")[1].split()[0])
    # The bisection's last refusal is the count below the choice (per device, one
    # remat policy): the estimate falls as the microbatches rise.
    assert f"microbatches {chosen // 2}: does not fit" in err and " estimates in " in last
