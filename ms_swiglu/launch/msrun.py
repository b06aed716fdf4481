"""``ms-swiglu run --tp-size K`` (``--ep-size K``): K ranks (``ms_swiglu.launch.worker``) through MindSpore's
launcher, msrun; :class:`Job`, one msrun job, also runs ``export --ep-size``'s ranks.

The parent checks everything first (config, layer, tp size, input, output, msrun, the port), writes the input
to a job folder under $TMPDIR/ms-swiglu-tp, starts msrun in its own process group, and relays rank 0's result
line. Whatever happens (success, a failed worker, Ctrl-C) the whole group is ended before it returns. A failed
worker is reported as one line with the path of its log; the logs are kept then (the next run keeps the newest
three failed jobs' logs and removes older ones and any killed job's folder), and the job folder is removed after a
success or Ctrl-C.
"""
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from ms_swiglu.outputs import write_file
from ms_swiglu.processes import alive, safe_environment

from ms_swiglu.errors import InputError

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


class LaunchError(RuntimeError):
    """A worker or msrun failed (exit status 1, not a usage error)."""


def _free_port(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port or 0))
        except OSError:
            raise InputError(f"--master-port: expected a free port, got {port} (in use)") from None
        return s.getsockname()[1]


def _marked(marker):
    """PIDs of the processes whose command line holds `marker` (the job's work folder)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _end_job(proc, marker):
    """End msrun's process group and every process of the job: msrun starts the scheduler and the workers with
    setsid (outside its group), so they are found by the work folder in their command line."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in _marked(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(50):
            if proc.poll() is not None and not _marked(marker):
                return
            time.sleep(0.1)


def _failed_worker(log_dir):
    """(rank, log path, last error line) of the first worker whose log holds a traceback or an error."""
    for path in sorted(glob.glob(os.path.join(log_dir, "worker_*.log"))):
        with open(path, errors="replace") as f:
            lines = [line.rstrip() for line in f if not line.startswith("[WARNING")]
        errors = [line for line in lines if "Error" in line or "error:" in line]
        if any(line.startswith("Traceback") for line in lines) or errors:
            rank = os.path.basename(path)[len("worker_"):-len(".log")]
            return rank, path, (errors[-1] if errors else lines[-1] if lines else "")
    return None


def _wait(proc, log_dir):
    """Wait for msrun; the first failed worker (see :func:`_failed_worker`) as soon as its log shows it."""
    bad = None
    while proc.poll() is None and bad is None:  # a failed rank ends the job at once, not at msrun's pace
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            bad = _failed_worker(log_dir)
    return bad


def launch(args, x, out):
    """Run the worker script (:data:`WORKER`) on ``args.tp_size`` x ``args.ep_size`` ranks with the input ``x`` and
    rank 0 writing ``out``; relay rank 0's result lines. ``args``: the ``ms-swiglu run`` options."""
    with Job(args.tp_size * args.ep_size, args.master_port, args.log_dir) as job:
        np.save(os.path.join(job.work, "input.npy"), x)
        worker_args = ["--checkpoint", os.path.abspath(args.checkpoint), "--layer", str(args.layer),
                       "--input", os.path.join(job.work, "input.npy"), "--backend", args.backend,
                       "--repeat", str(args.repeat), "--tp-size", str(args.tp_size), "--ep-size", str(args.ep_size),
                       "--dispatch", args.dispatch]
        if out:  # rank 0 writes into the job folder; this process puts it in place (whole, or not at all)
            worker_args += ["--output", os.path.join(job.work, "output.npy")]
        if args.dtype:
            worker_args += ["--dtype", args.dtype]
        if args.quantize:
            worker_args += ["--quantize", args.quantize]
        job.run(WORKER, worker_args)
        for line in job.lines(0):
            if line.startswith("device "):
                print(line)
        if out:
            write_file(out, lambda tmp: shutil.copyfile(os.path.join(job.work, "output.npy"), tmp), args.force)
            print(f"wrote {out}")
    return 0


class Job:
    """One msrun job of ``world`` ranks on this node, in a job folder under $TMPDIR/ms-swiglu-tp (:attr:`work`,
    also the workers' working directory: compile files stay out of the user's folder). On leaving, msrun's group
    and every worker are ended; a failed job keeps its logs (named in the error), anything else is removed."""

    def __init__(self, world, master_port=None, log_dir=None):
        bin_dir = os.path.dirname(sys.executable)
        self.path = bin_dir + os.pathsep + os.environ.get("PATH", "")
        self.msrun = shutil.which("msrun", path=self.path)
        if self.msrun is None:
            raise InputError("msrun: expected MindSpore's launcher on PATH (it comes with mindspore), found none")
        self.world, self.port, self.log_arg = world, _free_port(master_port), log_dir
        self.work = self.proc = None
        self.failed = False

    def __enter__(self):
        self.work = _job_folder()
        self.log_dir = os.path.abspath(self.log_arg) if self.log_arg else os.path.join(self.work, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.work, RUNNING), "wb"):  # a job killed before its end leaves it (_job_folder)
            pass
        return self

    def run(self, script, worker_args):
        """Run ``script`` with ``worker_args`` on every rank and wait; LaunchError when a rank or msrun fails."""
        cmd = [self.msrun, f"--worker_num={self.world}", f"--local_worker_num={self.world}",
               f"--master_port={self.port}", f"--log_dir={self.log_dir}", "--join=True", script, *worker_args]
        env = safe_environment(dict(os.environ, PATH=self.path))  # msrun starts `python` from PATH: this interpreter's
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     env=env, cwd=self.work)
        bad = _wait(self.proc, self.log_dir)
        status = self.proc.returncode if self.proc.returncode is not None else 1
        bad = bad or _failed_worker(self.log_dir)
        if status != 0 or bad:
            self.failed = True
            if bad:
                rank, log, line = bad
                raise LaunchError(f"worker {rank} failed: {line.strip()[:300]} (log: {log})")
            raise LaunchError(f"msrun exited with status {status} (logs: {self.log_dir})")

    def lines(self, rank):
        """The lines rank ``rank`` printed (its log)."""
        with open(os.path.join(self.log_dir, f"worker_{rank}.log"), errors="replace") as f:
            return [line.rstrip() for line in f]

    def __exit__(self, kind, exc, tb):
        if self.proc is not None:
            _end_job(self.proc, self.work)
        if self.failed:  # the logs stay for diagnosis, named in the error line; the next run prunes them
            for name in os.listdir(self.work):  # all but the logs
                if os.path.join(self.work, name) == self.log_dir:
                    continue
                path = os.path.join(self.work, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.remove(path)
        else:  # done, or interrupted: nothing to keep, not even an empty $TMPDIR/ms-swiglu-tp
            shutil.rmtree(self.work, ignore_errors=True)
            with contextlib.suppress(OSError):  # fails while another job's folder is in it
                os.rmdir(os.path.dirname(self.work))


RUNNING = "running"  # in a job folder until the job ends: a killed job's folder is removed whole
JOBS = "ms-swiglu-tp"  # $TMPDIR/ms-swiglu-tp/<job>: a job's input and (by default) its logs
KEEP_FAILED = 3  # the logs of the newest failed jobs a run keeps


def _job_folder():
    """A new job folder under $TMPDIR/ms-swiglu-tp, after pruning the folders of ended jobs: a killed job's
    whole folder, and the logs of failed jobs but the newest KEEP_FAILED."""
    base = os.path.join(tempfile.gettempdir(), JOBS)
    os.makedirs(base, exist_ok=True)
    ended = []
    for entry in os.listdir(base):
        pid = entry.rsplit("-", 2)[-2] if entry.count("-") >= 2 else ""
        if pid.isdigit() and not alive(int(pid)):
            ended.append(os.path.join(base, entry))
    killed = [d for d in ended if os.path.exists(os.path.join(d, RUNNING))]
    failed = sorted(set(ended) - set(killed), key=os.path.getmtime)
    for folder in killed + failed[:-KEEP_FAILED]:
        shutil.rmtree(folder, ignore_errors=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        try:
            return tempfile.mkdtemp(prefix=f"{stamp}-{os.getpid()}-", dir=base)
        except FileNotFoundError:  # another job ending just removed the empty base
            os.makedirs(base, exist_ok=True)
    raise OSError(f"could not create a job folder in {base}")
