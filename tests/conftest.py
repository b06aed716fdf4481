"""Shared test set-up: the CPU device, both execution modes, the float64 reference and the tolerances."""
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types

import mindspore as ms
import numpy as np
import pytest
from hypothesis.configuration import set_hypothesis_home_dir
from mindspore import nn

from hf_checkpoint import make_checkpoint

ms.set_device("CPU")

from ms_swiglu.config import TOLERANCE as TOL  # dtype -> (atol, rtol)
MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """hypothesis keeps its examples and caches in the session's temporary folder (it writes them while the
    tests are collected), not in .hypothesis/ of the working directory."""
    set_hypothesis_home_dir(str(config._tmp_path_factory.mktemp("hypothesis")))


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    """make test runs the suite on two pytest-xdist workers (``-n 2 --dist loadfile``): each test file runs whole on
    one worker, so that its module fixtures run once (a session fixture of this file runs once per worker that
    uses it: each is used by one test file). The files run in collection order, those that wait for a background
    job (_bench_in_background) last, so that the job runs beside the others."""
    waiting = {item.path for item in items if {"bench_run", "kits", "made"} & set(item.fixturenames)}
    items.sort(key=lambda item: item.path in waiting)


@pytest.fixture(params=list(MODES))
def mode(request):
    """Runs the test once in GRAPH_MODE and once in PYNATIVE_MODE."""
    ms.set_context(mode=MODES[request.param])
    yield request.param
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.fixture(scope="session", autouse=True)
def _kernel_dir(tmp_path_factory):
    """AKG and the graph compiler write kernel_meta/ and logs into the working directory, and the CLI keeps job
    folders and logs under $TMPDIR: both inside the session's own temporary folder."""
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp_path_factory.mktemp("work"))
    tmp = str(tmp_path_factory.mktemp("tmpdir"))
    mp.setenv("TMPDIR", tmp)  # every subprocess's
    mp.setattr(tempfile, "tempdir", tmp)  # this process's
    yield
    mp.undo()


# The kernels' builds (isa.cc), best first: the instruction set each needs, by its name and by the CPU flags
# (/proc/cpuinfo's names) that isa.cc checks for it. avx512amx is avx512bf16's with W8A8's panel kernel on AMX-INT8
# tiles (and needs Linux to grant the process the tile data).
ISAS = {"avx512amx": ("AMX-INT8", {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "amx_tile",
                                   "amx_int8"}),
        "avx512bf16": ("AVX512-BF16", {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"}),
        "avx512": ("AVX-512", {"avx512f", "avx512bw", "avx512vl"}),
        "avx2": ("AVX2", {"avx2", "fma", "f16c"}),
        "generic": ("x86-64", set())}


@contextlib.contextmanager
def on_isa(name):
    """The cpu kernels on instruction set ``name`` (a key of ISAS) within the block (the best one again
    afterwards); the test is skipped, naming the instruction set, on a CPU without it."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415
    if name not in kernels.isas():
        needs, flags = ISAS[name]
        pytest.skip(f"needs {needs} ({', '.join(sorted(flags))}) for the {name} kernels; this CPU runs "
                    f"{', '.join(kernels.isas())}")
    best = kernels.isa()
    kernels.set_isa(name)
    try:
        yield
    finally:
        kernels.set_isa(best)


def needs_amx():
    """Skips the test, naming AMX-BF16, where the amx path cannot run: a CPU without AMX-BF16 (amx.cc checks for
    AVX512-FP16 too, which every such CPU has), or a Linux that does not give the process the tile data (the
    forced path then falls back to the skinny kernel)."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415
    if not kernels.tuning()["amx_available"]:
        flags = set(open("/proc/cpuinfo").read().split())
        why = ("this CPU has no AMX-BF16" if "amx_bf16" not in flags
               else "this CPU has AMX-BF16, but the process got no AMX tile data (Linux >= 5.16 grants it)")
        pytest.skip(f"needs AMX-BF16 for the amx path (TDPBF16PS tiles): {why}")


@contextlib.contextmanager
def on_path(path):
    """Within the block every GEMM takes path ``path`` (None: the automatic choice) on the instruction set that
    has its kernel: ``amx`` where the CPU has AMX-BF16 (else the test is skipped, saying "needs AMX-BF16"),
    ``panel`` on the avx2 kernels (AVX2's: on_isa("avx2") skips, saying "needs AVX2", without it). Compute the
    reference within the block too: the tuning table it reads follows the instruction set."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415
    if path == "amx":
        needs_amx()
    with on_isa("avx2") if path == "panel" else contextlib.nullcontext():
        with contextlib.nullcontext() if path is None else kernels.forced_path(path):
            yield


def q_op(op, w, scale):
    """The library's op ``op`` for int8 weights ``w`` with ``scale``: the per-row format's for scales [..., M], the
    grouped format's for [..., M, G] (ms_swiglu.backends.cpu.kernels.op_name)."""
    from ms_swiglu.backends.cpu import kernels  # noqa: PLC0415

    return kernels.op_name(op, "int8" if np.ndim(scale) < np.ndim(w) else "int8-g128")


def to_tensor(a, dtype):
    """A float32 NumPy array as a Tensor of dtype (a name), plus the float64 copy of the rounded values."""
    t = ms.Tensor(np.asarray(a, np.float32)).astype(DTYPES[dtype])
    return t, to_f64(t)


def to_f64(t):
    return t.astype(ms.float32).asnumpy().astype(np.float64)


def ref_swiglu(x):
    """float64 reference of the forward: [..., 2I] -> [..., I]."""
    gate, up = np.split(x, 2, axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        return gate / (1.0 + np.exp(-gate)) * up


def ref_swiglu_grad(x, dy):
    """float64 reference of the backward: [..., 2I], [..., I] -> [..., 2I] = [d_gate, d_up]."""
    gate, up = np.split(x, 2, axis=-1)
    s = 1.0 / (1.0 + np.exp(-gate))
    silu = gate * s
    return np.concatenate([dy * up * (s + silu * (1.0 - s)), dy * silu], axis=-1)


def assert_close(actual, expected, dtype, what=""):
    """actual (Tensor or array) against the float64 reference within the dtype's tolerance; NaN must match NaN."""
    atol, rtol = TOL[dtype]
    a = to_f64(actual) if isinstance(actual, ms.Tensor) else np.asarray(actual, np.float64)
    assert a.shape == expected.shape, f"{what}: shape {a.shape} != expected {expected.shape}"
    np.testing.assert_allclose(a, expected, atol=atol, rtol=rtol, equal_nan=True, err_msg=what)


class LossCell(nn.Cell):
    """sum(net(x) * dy) in float32 (the CPU has no bfloat16 sum): its gradient is the vector-Jacobian product."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x, dy):
        return (self.net(x).astype(ms.float32) * dy.astype(ms.float32)).sum()


# ---- the ms-swiglu command: many commands in one process, and runs that several test files share ----------------

EXE = os.path.join(os.path.dirname(sys.executable), "ms-swiglu")
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass
class Ran:
    """One command run by :func:`cli_batch`: the fields of subprocess.CompletedProcess the tests read, and the
    watched folders' entries ({name: kind}, f file, d folder, p FIFO, c character device, l symlink; None: no
    folder) right after it."""
    args: list
    returncode: int
    stdout: str
    stderr: str
    watched: dict


def cli_batch(cases, *, env=None, timeout=600):
    """Runs ``ms-swiglu`` commands one after the other in one process (tests/cli_driver.py: one start-up of
    Python and MindSpore for all of them, each command's status and output its own). A case is an argv list, or
    a dict {"argv": [...], "cwd": folder, "watch": [folders]}. Returns a :class:`Ran` per case, in order."""
    return cli_batch_start(cases, env=env).wait(timeout)


class _Job:
    """A process whose stdin, stdout and stderr are files in ``folder`` and whose exit status is written to
    ``folder/rc`` when it ends: one that any process of the session can wait for (the xdist workers share the
    session's background jobs). ``argv`` None: a job another process started there."""

    def __init__(self, folder, argv=None, stdin="", env=None, cwd=None):
        self.folder, self.args, self.proc = folder, argv, None
        if argv is None:
            return
        os.makedirs(folder, exist_ok=True)
        files = [os.path.join(folder, n) for n in ("stdin", "stdout", "stderr", "rc")]
        with open(files[0], "w") as f:
            f.write(stdin)
        script = 'i=$1 o=$2 e=$3 r=$4; shift 4; "$@" < "$i" > "$o" 2> "$e"; echo $? > "$r.part"; mv "$r.part" "$r"'
        self.proc = subprocess.Popen(["sh", "-c", script, "sh", *files, *map(str, argv)], cwd=cwd, env=env,
                                     start_new_session=True)

    def poll(self):
        """Its exit status, None while it runs."""
        try:
            with open(os.path.join(self.folder, "rc")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    @property
    def returncode(self):
        return self.poll()

    def wait(self, timeout=900):
        deadline = time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args or self.folder, timeout)
            time.sleep(0.2)
        if self.proc is not None:
            self.proc.wait()
        return rc

    def output(self, name):
        with open(os.path.join(self.folder, name), errors="replace") as f:
            return f.read()

    def stop(self):
        """Ends it (and what it started) if this process started it and it still runs."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class _Batch:
    """A :func:`cli_batch` running in the background (a :class:`_Job` in ``folder``, by default a new one in the
    session's $TMPDIR); :meth:`wait` gives its results. ``start`` False: the batch another process started in
    ``folder`` with this spec."""

    def __init__(self, spec, env, folder=None, start=True):
        self.spec = spec
        folder = folder or tempfile.mkdtemp(prefix="batch-")
        argv = [sys.executable, "-I", os.path.join(HERE, "cli_driver.py")] if start else None
        self.proc = _Job(folder, argv, json.dumps(spec), env)

    def wait(self, timeout=600):
        rc = self.proc.wait(timeout=timeout)
        stdout, stderr = self.proc.output("stdout"), self.proc.output("stderr")
        results = [json.loads(line[len("CASE "):]) for line in stdout.splitlines() if line.startswith("CASE ")]
        assert rc == 0 and len(results) == len(self.spec), (
            f"cli_driver: exit {rc} after {len(results)} of {len(self.spec)} commands\n{stderr[-3000:]}")
        return [Ran(c["argv"], res["status"], res["stdout"], res["stderr"], res["watched"])
                for c, res in zip(self.spec, results)]

    def stop(self):
        self.proc.stop()


def cli_batch_start(cases, *, env=None, folder=None, start=True):
    """:func:`cli_batch` started in the background (a :class:`_Batch`; in ``folder`` where given; ``start`` False:
    the one another process started there)."""
    spec = [{"argv": [str(a) for a in c]} if isinstance(c, list) else
            {"argv": [str(a) for a in c["argv"]], "cwd": str(c["cwd"]) if c.get("cwd") else None,
             "watch": [str(w) for w in c.get("watch", ())]} for c in cases]
    return _Batch(spec, env, folder, start)


SHADOWS = ("glob", "json", "numpy", "subprocess", "safetensors", "mindspore")


def hostile_folder(folder):
    """A new folder whose modules, if a process started in it imported them, would leave a mark (PWNED-<name>,
    see :func:`pwned`) and fail: a working directory the command's children must not import from."""
    folder.mkdir(parents=True)
    for name in SHADOWS:
        (folder / f"{name}.py").write_text(f"open({str(folder / ('PWNED-' + name))!r}, 'w').close()\n"
                                           f"raise SystemExit('shadowed {name} imported')\n")
    return folder


def pwned(folder):
    """The marks a shadow module of :func:`hostile_folder` left: the modules some process imported from it."""
    return sorted(f for f in os.listdir(folder) if f.startswith("PWNED"))


def processes_naming(text):
    """``["pid command line"]`` of the processes (but this one) whose command line holds ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # (ended meanwhile)
            continue
        if str(text) in args and int(pid) != os.getpid():
            found.append(f"{pid} {args}")
    return found


def job_processes(folder):
    """The launcher and worker processes of this test session: their command lines name the checkpoint `folder`
    under pytest's temporary root, so another suite's on the same machine (a second `make test`) are not counted."""
    return [p for p in processes_naming(os.path.dirname(folder)) if "worker.py" in p or "msrun" in p]


# `ms-swiglu` with the launcher's worker replaced by tests/tp_fault_worker.py (rank $TP_FAULT_RANK fails)
FAULTY_TP = [sys.executable, "-c", "import sys; from ms_swiglu.launch import msrun; msrun.WORKER = sys.argv[1]; "
             "from ms_swiglu import cli; sys.exit(cli.main(sys.argv[2:]))", os.path.join(HERE, "tp_fault_worker.py")]
TP_H = 32  # hidden size of tp_ckpt


@pytest.fixture(scope="session")
def tp_ckpt(tmp_path_factory):
    """The dense checkpoint of the tensor-parallel runs (hidden 32, intermediate 48, two layers): (folder, stored)."""
    folder = tmp_path_factory.mktemp("tp_dense")
    return str(folder), make_checkpoint(folder, hidden=TP_H, inter=48, layers=2, seed=21)


def _tp_job(tmp_path_factory, name, x):
    """A new folder for one tensor-parallel job: its input x.npy, an empty tmp/ for its $TMPDIR."""
    root = tmp_path_factory.mktemp(name)
    np.save(root / "x.npy", np.asarray(x, np.float32))
    (root / "tmp").mkdir()
    return root


@pytest.fixture(scope="session")
def tp_success(tp_ckpt, tmp_path_factory):
    """One `ms-swiglu run --tp-size 2` (msrun, two ranks) of tp_ckpt's layer 0 that succeeds, run from a
    hostile working directory with its own $TMPDIR. Shared (an msrun job costs tens of seconds): test_parallel
    compares its output with one process's, test_reliability checks what it leaves in $TMPDIR and that none of its
    processes imported from the working directory."""
    root = _tp_job(tmp_path_factory, "tp_success", np.random.default_rng(2).standard_normal((3, 5, TP_H)))
    cwd = hostile_folder(root / "cwd")
    r = subprocess.run([EXE, "run", "--checkpoint", tp_ckpt[0], "--layer", "0", "--input", str(root / "x.npy"),
                        "--output", str(root / "y.npy"), "--dtype", "float32", "--tp-size", "2"], cwd=cwd,
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, TMPDIR=str(root / "tmp")))
    return types.SimpleNamespace(result=r, x=root / "x.npy", y=root / "y.npy", cwd=cwd, tmp=root / "tmp")


OLD_JOBS = [f"20260101-00000{i}-999999{i}-x" for i in range(5)]  # failed jobs of ended processes, oldest first
KILLED_JOB = "20260101-000009-9999990-k"  # a killed job's folder, still marked running


@pytest.fixture(scope="session")
def tp_failure(tp_ckpt, tmp_path_factory):
    """One tensor-parallel run (--tp-size 2, --output y.npy) whose rank 1 fails (tests/tp_fault_worker.py), its
    $TMPDIR/ms-swiglu-tp holding beforehand the folders of OLD_JOBS (with logs) and of KILLED_JOB. Shared:
    test_parallel checks the report, that nothing is left running and no output; test_reliability which job
    folders it keeps."""
    root = _tp_job(tmp_path_factory, "tp_failure", np.ones((2, TP_H)))
    jobs = root / "tmp" / "ms-swiglu-tp"
    for i, name in enumerate(OLD_JOBS):
        (jobs / name / "logs").mkdir(parents=True)
        os.utime(jobs / name, (i, i))
    (jobs / KILLED_JOB).mkdir()
    (jobs / KILLED_JOB / "running").write_bytes(b"")  # what a job's folder holds until the job ends
    r = subprocess.run(FAULTY_TP + ["run", "--checkpoint", tp_ckpt[0], "--layer", "0", "--input", str(root / "x.npy"),
                                    "--output", str(root / "y.npy"), "--tp-size", "2"], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, TMPDIR=str(root / "tmp"), TP_FAULT_RANK="1"))
    return types.SimpleNamespace(result=r, y=root / "y.npy", jobs=jobs)


@pytest.fixture(scope="session")
def tp_interrupted(tp_ckpt, tmp_path_factory):
    """Ctrl-C (SIGINT) to a tensor-parallel run once both its ranks run and have logs (no rank 9 fails: both
    wait), with its own $TMPDIR. Shared by test_parallel (every process ended) and test_reliability (no job
    folder left): the ranks seen running before the signal, the exit status and stderr."""
    root = _tp_job(tmp_path_factory, "tp_interrupted", np.ones((2, TP_H)))
    jobs = root / "tmp" / "ms-swiglu-tp"
    proc = subprocess.Popen(FAULTY_TP + ["run", "--checkpoint", tp_ckpt[0], "--layer", "0", "--input",
                                         str(root / "x.npy"), "--tp-size", "2"], stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(root / "tmp"), TP_FAULT_RANK="9"))

    def ranks():
        return [p for p in job_processes(tp_ckpt[0]) if "worker.py" in p]

    deadline = time.time() + 120
    while time.time() < deadline and not (len(ranks()) >= 2 and list(jobs.glob("*/logs/worker_1.log"))):
        time.sleep(0.2)
    time.sleep(2)
    seen = ranks()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return types.SimpleNamespace(returncode=proc.returncode, stderr=err, ranks_seen=seen, jobs=jobs)


BENCH = ["bench", "--preset", "tiny", "--tokens", "1", "4", "--rounds", "2", "--memory", "--layers", "2",
         "--model-blocks", "2", "--jit", "O0", "O1", "--dtype", "float32", "bfloat16", "--retries", "0", "--settle",
         "0.01"]


_BACKGROUND = []  # the jobs the session started in the background (bench, kits, device check), as _Job s


def _shared_root(tmp_path_factory):
    """The folder of the session's background jobs: one for all xdist workers (their base folders' parent)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "background"
    root.mkdir(exist_ok=True)
    return root


def _starts_jobs():
    """Whether this process starts the background jobs: the session itself, or xdist's first worker."""
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"


@pytest.fixture(scope="session")
def bench_started(tmp_path_factory):
    """`ms-swiglu bench` end to end on the tiny shape (BENCH: every variant at both jit levels, two dtypes and
    token counts, --memory's probe processes, a model of two blocks; --json b.json, --plot b.png), started from a
    hostile working directory with its own $TMPDIR, its stdout and stderr into files: (its _Job, its folder).
    Ended at the session's end if still running."""
    root = _shared_root(tmp_path_factory) / "bench"
    if not _starts_jobs():
        yield _Job(root.parent / "bench-job"), root
        return
    root.mkdir()
    cwd = hostile_folder(root / "cwd")
    (root / "tmp").mkdir()
    job = _Job(root.parent / "bench-job", [EXE, *BENCH, "--json", root / "b.json", "--plot", root / "b.png"], cwd=cwd,
               env=dict(os.environ, TMPDIR=str(root / "tmp")))
    _BACKGROUND.append(job)
    yield job, root
    _finish(job)


def _finish(job):
    """At the session's end: a job another worker may still wait for runs on to its end, then is stopped."""
    try:
        job.wait(timeout=900)
    finally:
        job.stop()


@pytest.fixture(scope="session", autouse=True)
def _bench_in_background(request):
    """Starts the bench (bench_started), the kits of tests/test_kit_acceptance.py (kits_started) and the device
    check of tests/test_device_check.py (device_check_started) with the session when a selected test uses them:
    each takes a minute or more, mostly of one core, and the tests before them run beside them. Under xdist the
    first worker starts them (every worker collects every test) and the worker that runs their tests waits for
    their files. test_bench.py's timed tests run after bench_run, its first test, has waited for it."""
    if not _starts_jobs():
        return
    used = {name for item in request.session.items for name in item.fixturenames}
    if "bench_run" in used:
        request.getfixturevalue("bench_started")
    if "kits" in used:
        request.getfixturevalue("kits_started")
    if "made" in used:
        request.getfixturevalue("device_check_started")


@pytest.fixture(scope="session")
def device_check_started(tmp_path_factory):
    """tests/test_device_check.py's commands, started in the background: (root folder, case names, the batch)."""
    from test_device_check import set_cases, start_set  # noqa: PLC0415

    root = _shared_root(tmp_path_factory) / "device_check"
    if not _starts_jobs():
        names, cases = set_cases(root)
        yield root, names, cli_batch_start(cases, folder=root.parent / "device_check-job", start=False)
        return
    root.mkdir()
    names, batch = start_set(root, root.parent / "device_check-job")
    _BACKGROUND.append(batch.proc)
    yield root, names, batch
    _finish(batch.proc)


@pytest.fixture
def background_done(tmp_path_factory):
    """Waits for the session's background jobs (every worker's): a test whose benchmark's probes need every thread
    on a CPU of its own runs after them."""
    root = _shared_root(tmp_path_factory)
    for job in [*_BACKGROUND, *(_Job(d) for d in root.glob("*-job"))]:
        job.wait(timeout=900)


@pytest.fixture(scope="session")
def kits_started(tmp_path_factory):
    """tests/test_kit_acceptance.py's exports, started in the background: (root folder, the batch)."""
    from kit_cases import KITS, make_checkpoints  # noqa: PLC0415

    root = _shared_root(tmp_path_factory) / "kits"
    cases = [["export", "--checkpoint", root / ck, *opts, "--output-dir", root / name] for name, (ck, opts) in
             KITS.items()]
    if not _starts_jobs():
        yield root, cli_batch_start(cases, folder=root.parent / "kits-job", start=False)
        return
    root.mkdir()
    make_checkpoints(root)
    batch = cli_batch_start(cases, folder=root.parent / "kits-job")
    _BACKGROUND.append(batch.proc)
    yield root, batch
    _finish(batch.proc)


@pytest.fixture(scope="session")
def bench_run(bench_started):
    """The bench's run, waited for. Shared: test_bench checks its report, test_reliability that none of its
    processes imported from the working directory: its result (a CompletedProcess), the paths of its JSON and
    plot, its working directory."""
    job, root = bench_started
    rc = job.wait(timeout=900)
    out, err = job.output("stdout"), job.output("stderr")
    return types.SimpleNamespace(result=subprocess.CompletedProcess([EXE, *BENCH], rc, out, err),
                                 json=root / "b.json", png=root / "b.png", cwd=root / "cwd")


@pytest.fixture(scope="session")
def export_ckpt(tmp_path_factory):
    """test_export's dense checkpoint (hidden 32, intermediate 48, three layers): (folder, stored)."""
    folder = tmp_path_factory.mktemp("export_ckpt")
    return str(folder), make_checkpoint(folder, layers=3, seed=11)


@pytest.fixture(scope="session")
def target_exports(export_ckpt, tmp_path_factory):
    """One export per target (ascend, portable, cpu) of export_ckpt's layer 1, float32, each run from a hostile
    working directory. Shared: test_export reads the kits ({target: (folder, manifest, stdout)}), test_reliability
    checks that none of the export's children imported from the working directory."""
    cwd = hostile_folder(tmp_path_factory.mktemp("export_cwd") / "cwd")
    kits = {}
    for target in ("ascend", "portable", "cpu"):
        d = tmp_path_factory.mktemp(f"exp_{target}")
        r = subprocess.run([EXE, "export", "--checkpoint", export_ckpt[0], "--layer", "1", "--output-dir", str(d),
                            "--target", target], cwd=cwd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        kits[target] = (d, json.loads((d / "manifest.json").read_text()), r.stdout)
    return types.SimpleNamespace(kits=kits, cwd=cwd)
