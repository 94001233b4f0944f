"""Tables: the results files behind the paper, the machines they ran on, and versions.

Built last, from the files the other figures and tables actually drew from.
"""
from __future__ import annotations

from ..core import Context, FigureSpec, Skip
from ..macros import integer, sig
from ..results import ResultsFile
from ..tables import escape

FILES_CAPTION = (r"The results files every figure and table of this paper was generated from "
                 r"(\texttt{benchmark/results/}), with the machine each ran on.")
VERSIONS_CAPTION = r"Software versions recorded in those results files."

MACROS = ("MachineCpus", "MachineMemGiB", "MachineCpuModel", "ResultsFilesUsed")
PACKAGES = ("cascade", "python", "numpy", "mpi4py", "blake3", "lmcache", "torch", "redis", "h5py", "mooncake")


def _machine(rf: ResultsFile) -> dict | None:
    machine = rf.doc.get("machine")
    return machine if isinstance(machine, dict) else None


def build(ctx: Context) -> list[ResultsFile]:
    used = list(ctx.used)
    if not used:
        raise Skip("no figure or table was generated from results")
    with_machine = [f for f in used if _machine(f)]
    if not with_machine:
        raise Skip("none of the results files used records its machine (field 'machine')")
    ref = with_machine[0]
    m = ctx.macros
    m.add("MachineCpus", integer(ref.num("machine", "cpus")), ref.source("machine", "cpus"))
    m.add("MachineMemGiB", sig(ref.num("machine", "memory_bytes") / (1 << 30)), ref.source("machine", "memory_bytes"))
    m.add("MachineCpuModel", escape(str(ref.get("machine", "cpu_model"))), ref.source("machine", "cpu_model"))
    m.add("ResultsFilesUsed", integer(len(used)), "count of the files listed in Tables/results_files.tex")

    t = ctx.table("results_files", [("results file", "l"), ("ranks", "r"), ("nodes", "r"), ("host", "l"),
                                    ("CPUs", "r"), ("memory (GiB)", "r"), ("kernel", "l")], used)
    for f in used:
        mach = _machine(f) or {}
        host = mach.get("hostname") or f.doc.get("host") or "--"
        t.add(f"\\texttt{{{escape(f.path.name)}}}", integer(f.ranks), integer(f.nodes), escape(str(host)),
              integer(mach["cpus"]) if isinstance(mach.get("cpus"), int) else "--",
              sig(mach["memory_bytes"] / (1 << 30)) if isinstance(mach.get("memory_bytes"), int) else "--",
              escape(str(mach.get("kernel", "--"))))
    ctx.put(t)

    versions: dict[str, set[str]] = {}
    for f in used:
        recorded = f.doc.get("versions")
        if isinstance(recorded, dict):
            for pkg, v in recorded.items():
                versions.setdefault(pkg, set()).add(str(v))
        mach = _machine(f)
        if mach and "python" in mach:
            versions.setdefault("python", set()).add(str(mach["python"]))
    v = ctx.table("versions", [("package", "l"), ("version", "l")], used)
    for pkg in [p for p in PACKAGES if p in versions] + sorted(set(versions) - set(PACKAGES)):
        v.add(escape(pkg), escape(", ".join(sorted(versions[pkg]))))
    ctx.put(v)
    return used


SPEC = FigureSpec("machine", "", "any results file with machine facts", build, macros=MACROS,
                  tables={"results_files": FILES_CAPTION, "versions": VERSIONS_CAPTION},
                  wide_tables=("results_files",), figure=False)
