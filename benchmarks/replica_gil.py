"""What writing a host-local replica (:func:`datastore.replica.write_replica`) costs the work beside it in an engine's
process: a thread of that process (where :class:`datastore.replica.HostReplicas` writes one today) against a child
process.

The main thread stands in for an engine's forward pass: a loop of ``[2048, 256] @ [256, 256]`` float32 matmuls, each of
which numpy runs with the GIL released, as torch runs its operators. Printed per setting, over ``--alone-s`` seconds
with nothing else, then over the write of the datastore's replica (to a temporary file, removed): each matmul's p50,
p99 and max (ms), matmuls per second, and the write's seconds. A writer thread takes the GIL each time the main thread
releases it and keeps it up to the switch interval (``sys.getswitchinterval()``), so the main thread's work slows far
more than by the core the write takes.

    .venv/bin/python benchmarks/replica_gil.py [--datastore sharegpt] [--writers thread process] [--alone-s 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import psycopg  # noqa: E402

from datastore.errors import DatastoreNotFound  # noqa: E402
from datastore.registry import resolve_build  # noqa: E402
from datastore.replica import database_key, identity_of, write_replica  # noqa: E402
from toolkit.options import float_in  # noqa: E402
from toolkit.settings import Settings  # noqa: E402


def write(url: str, name: str, path: Path) -> dict:
    """Write the replica of datastore ``name``'s build to ``path``: its ``seconds`` and ``bytes``."""
    with psycopg.connect(url) as conn:
        info, key = resolve_build(conn, name), database_key(conn)
    report = write_replica(url, info, path, identity_of(info, key))
    return {"seconds": report.seconds, "bytes": report.bytes}


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--datastore", default="sharegpt",
                    help="the datastore whose replica is written (default: sharegpt).")
    ap.add_argument("--writers", nargs="+", choices=["thread", "process"], default=["thread", "process"],
                    help="who writes it: a thread of this process, or a child process (default: both, in turn).")
    ap.add_argument("--alone-s", type=float_in(0.1, 600), default=3.0,
                    help="seconds of matmuls timed with nothing else running, before each write (default: 3).")
    ap.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)  # the child process: write to PATH, print JSON
    return ap


def _matmuls(a: np.ndarray, b: np.ndarray, until) -> np.ndarray:
    """Each matmul's seconds, until ``until()`` is true (checked after each)."""
    out = []
    while True:
        start = time.perf_counter()
        a @ b
        out.append(time.perf_counter() - start)
        if until():
            return np.asarray(out)


def _line(label: str, times: np.ndarray) -> str:
    ms = times * 1e3
    return (f"  {label:<16} matmuls {len(ms):7,d}  p50 {np.median(ms):8.3f}  p99 {np.percentile(ms, 99):8.3f}  "
            f"max {ms.max():8.1f} ms  per second {len(ms) / times.sum():7.0f}")


def _during(writer: str, url: str, name: str, path: Path, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, dict]:
    """The matmuls' seconds while ``writer`` (``thread`` or ``process``) writes the replica to ``path``, and the
    write's figures."""
    result: dict = {}
    if writer == "thread":
        thread = threading.Thread(target=lambda: result.update(write(url, name, path)), name="replica-writer")
        thread.start()
        busy = _matmuls(a, b, lambda: not thread.is_alive())
        thread.join()
        if not result:
            raise SystemExit("the thread writing the replica failed (its error is above)")
        return busy, result
    child = subprocess.Popen([sys.executable, __file__, "--datastore", name, "--child", str(path)],
                             stdout=subprocess.PIPE, text=True)
    busy = _matmuls(a, b, lambda: child.poll() is not None)
    out, _ = child.communicate()
    if child.returncode:
        raise SystemExit(f"the child writing the replica failed (exit {child.returncode})")
    return busy, json.loads(out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url = Settings.from_env().database_url
    if url is None:
        raise SystemExit("set DATABASE_URL to the database holding --datastore")
    try:  # at the door: a datastore that is not there stops the run before anything is timed
        with psycopg.connect(url) as conn:
            resolve_build(conn, args.datastore)
    except DatastoreNotFound as exc:
        raise SystemExit(f"--datastore {args.datastore}: {exc}") from None
    if args.child:
        print(json.dumps(write(url, args.datastore, Path(args.child))))
        return 0
    rng = np.random.default_rng(0)
    a, b = rng.random((2048, 256), np.float32), rng.random((256, 256), np.float32)
    print(f"datastore {args.datastore}; switch interval {sys.getswitchinterval() * 1e3:g} ms")
    with tempfile.TemporaryDirectory() as tmp:
        for writer in args.writers:
            path = Path(tmp) / f"replica-{writer}.bin"
            deadline = time.perf_counter() + args.alone_s
            alone = _matmuls(a, b, lambda end=deadline: time.perf_counter() >= end)
            busy, result = _during(writer, url, args.datastore, path, a, b)
            path.unlink(missing_ok=True)
            print(f"writer: {writer}; replica {result['bytes'] / 2**20:,.1f} MiB written in {result['seconds']:.1f} s")
            print(_line("alone", alone))
            print(_line("during the write", busy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
