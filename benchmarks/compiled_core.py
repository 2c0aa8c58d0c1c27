"""The detection core compiled to C with mypyc, against the same core interpreted: what compiling buys.

The worker's target of 0.25 of a bare consumer needs, on a cluster scraped every 6 hours, a
detection core several times faster; the cheapest way to a compiled core is mypyc, mypy's
compiler of typed Python, on the code as it is (``detectors/`` is ``mypy --strict`` clean). This measures it:

    python benchmarks/compiled_core.py                  # 100 nodes x 30 days, 3 runs a side
    python benchmarks/compiled_core.py --sim DIR --runs 5   # a simulation already made
    python benchmarks/compiled_core.py --smoke          # CI: 4 nodes x 1 day, 1 run a side

It copies ``schemas/``, ``detectors/`` and ``stream/`` of this checkout to a temporary folder and
compiles there the detector modules mypyc takes as they are (:data:`COMPILED`; the others stay
Python, see :data:`LEFT_INTERPRETED`), then times ``benchmarks/core_alone.py`` (the replay's records
parsed beforehand, only ``DetectionCore.process`` timed) on the same records with each copy,
interpreted and compiled taking turns, the median of ``--runs`` runs a side. It checks that both
cores emit the same outputs (a digest of every incident, attribution, MTTF row and ECC row), and
prints one table. Needs a C compiler and the Python headers (gcc and python3-dev on Debian) and
the dev extra's mypy; the build takes ~30 s on two cores.

Nothing of the product uses the compiled copy: this is a measurement for a decision.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stream.simulator import SimulationConfig, simulate

ROOT = Path(__file__).resolve().parents[1]

#: Detector modules compiled (most of the core's time; they compile unchanged but for one line).
COMPILED = (
    "core", "ecc", "ecc_rules", "fleet", "lemon", "exposure", "jobs", "mttf", "surprise", "attribution",
    "incidents",
)  # fmt: skip
#: Detector modules left interpreted, and why.
LEFT_INTERPRETED = {
    "thresholds, ecc_trend, xid_burst": "subclass River's estimators (an ABCMeta metaclass, which mypyc's "
    "native classes refuse; as non-native classes they need River type-checked, >10 min), and mypyc 2.4 "
    "cannot make the text signature of their factories (a default, then **params)",
    "xid_catalog, xid_nvidia, sxid_catalog": "tables and their lookups, cached; not on the hot path",
    "schemas (the records, decoded by the worker)": "not tried: they are built by a __class__ switch from a "
    "mutable twin, which native classes may not allow",
}
#: mypy options of the build: River and numpy are not followed (typed as Any), so that the build
#: type-checks this project only (following River takes over ten minutes).
MYPY_CONFIG = """\
[mypy]
python_version = 3.11
strict = True
disallow_subclassing_any = False
warn_return_any = False
warn_unused_ignores = False
[mypy-numpy.*]
follow_imports = skip
[mypy-river.*]
follow_imports = skip
"""
#: mypyc compiles an exception class only as a non-native class (it inherits from RuntimeError).
_EXCEPTION = "class FleetBaselineMissing(RuntimeError):"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def copy_tree(target: Path) -> None:
    """This checkout's packages and the core-alone script under ``target``, ready for mypyc."""
    for package in ("schemas", "detectors", "stream"):
        skip = shutil.ignore_patterns("__pycache__", "*.so")
        shutil.copytree(ROOT / package, target / package, ignore=skip)
    shutil.copytree(ROOT / "benchmarks", target / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    core = target / "detectors" / "core.py"
    source = core.read_text()
    if source.count(_EXCEPTION) != 1:
        raise SystemExit(f"{core}: expected one {_EXCEPTION!r} to mark for mypyc")
    source = source.replace(_EXCEPTION, "@mypyc_attr(native_class=False)\n" + _EXCEPTION)
    source = re.sub(
        r"^from __future__ import annotations\n",
        "from __future__ import annotations\n\nfrom mypy_extensions import mypyc_attr\n",
        source,
        count=1,
        flags=re.M,
    )
    core.write_text(source)
    (target / "mypyc.ini").write_text(MYPY_CONFIG)


def compile_core(target: Path) -> float:
    """Compile :data:`COMPILED` in place under ``target``; seconds the build took."""
    modules = [f"detectors/{name}.py" for name in COMPILED]
    setup = target / "setup_mypyc.py"
    setup.write_text(
        "from setuptools import setup\nfrom mypyc.build import mypycify\n"
        "setup(name='faultstream_core_mypyc',\n"
        f"      ext_modules=mypycify(['--config-file', 'mypyc.ini', *{modules!r}], opt_level='3'))\n"
    )
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, setup.name, "build_ext", "--inplace"], cwd=target, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the mypyc build failed (needs gcc and the Python headers):\n{done.stdout[-3000:]}"
                         f"\n{done.stderr[-3000:]}")  # fmt: skip
    built = sorted(path.name.split(".")[0] for path in (target / "detectors").glob("*.so"))
    if built != sorted(COMPILED):
        raise SystemExit(f"mypyc built {built}, expected {sorted(COMPILED)}")
    return time.perf_counter() - started


def core_run(tree: Path, files: list[Path], digest: bool) -> dict[str, object]:
    """One run of ``core_alone.py`` from ``tree`` (its packages first on the path)."""
    args = [sys.executable, str(tree / "benchmarks" / "core_alone.py"), *map(str, files)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([*args, *(["--digest"] if digest else [])], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"core_alone.py failed in {tree}:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sim", type=Path, help="a simulation's folder (kernel.log, sacct.txt, dcgm.prom)")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3, help="runs a side; the table shows the median")
    parser.add_argument("--smoke", action="store_true", help="4 nodes x 1 day, 1 run a side (CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.days, args.runs = 4, 1, 1
    with tempfile.TemporaryDirectory(prefix="compiled-core-") as scratch:
        work = Path(scratch)
        sim = args.sim
        if sim is None:
            sim = work / "sim"
            log(f"simulating {args.nodes} nodes x {args.days} days into {sim} ...")
            simulate(SimulationConfig(nodes=args.nodes, days=args.days), sim)
        files = [sim / name for name in ("kernel.log", "sacct.txt", "dcgm.prom")]
        interpreted, compiled = work / "interpreted", work / "compiled"
        for tree in (interpreted, compiled):
            copy_tree(tree)
        log(f"compiling {len(COMPILED)} detector modules with mypyc ...")
        build_seconds = compile_core(compiled)
        check = {name: core_run(tree, files, digest=True) for name, tree in
                 (("interpreted", interpreted), ("compiled", compiled))}  # fmt: skip
        same = check["interpreted"]["digest"] == check["compiled"]["digest"]
        if not same:
            raise SystemExit(f"the compiled core emits other outputs than the interpreted one: {check}")
        seconds: dict[str, list[float]] = {"interpreted": [], "compiled": []}
        records = 0
        for run in range(args.runs):
            for name, tree in (("interpreted", interpreted), ("compiled", compiled)):
                result = core_run(tree, files, digest=False)
                records = int(str(result["records"]))
                seconds[name].append(float(str(result["seconds"])))
                log(f"  run {run + 1}: {name} {seconds[name][-1]:.3f} s")
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"detection core alone on {records:,} records ({sim if args.sim else 'simulated'}), "
          f"median of {args.runs} run(s) a side, taking turns")  # fmt: skip
    print(f"{'':44}{'seconds':>10}{'records/s':>12}{'µs a record':>14}")
    for name in ("interpreted", "compiled"):
        print(f"{'core ' + name:44}{median[name]:>10.3f}{records / median[name]:>12,.0f}"
              f"{1e6 * median[name] / records:>14.2f}")  # fmt: skip
    ratio = median["interpreted"] / median["compiled"]
    print(f"{'ratio compiled / interpreted (records/s)':44}{ratio:>10.2f}")
    print(f"outputs equal: {'yes' if same else 'no'} (digest {check['compiled']['digest']})")
    print(f"compiled with mypyc: detectors/{{{', '.join(COMPILED)}}} (build {build_seconds:.0f} s)")
    for names, why in LEFT_INTERPRETED.items():
        print(f"left interpreted: {names}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
