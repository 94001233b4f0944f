"""Tables: the results files behind the paper, the machines they ran on, and versions.

Built last, from the files the other figures and tables actually drew from.
"""
from __future__ import annotations

from ..core import Context, FigureSpec, Skip
from ..macros import integer, sig
from ..results import ResultsFile, display_path
from ..tables import escape

FILES_CAPTION = (r"The results files every figure and table of this paper was generated from: one suite run "
                 r"(\texttt{\SuiteName}, commit \texttt{\SuiteCommit}), each workload repeated \SuiteReps "
                 r"times\SuiteDevice (the first repetition's file is named; ``runs'': how many repetitions of it "
                 r"its suite run holds), with the machine each ran on.")
VERSIONS_CAPTION = (r"Software versions recorded in those results files: the suite run \texttt{\SuiteName} "
                    r"(commit \texttt{\SuiteCommit})\SuiteDevice.")

MACROS = ("MachineCpus", "MachineMemGiB", "MachineCpuModel", "ResultsFilesUsed", "SuiteReps", "SuiteCommit",
          "SuiteName", "SuiteDirty", "SuiteDevice")
PACKAGES = ("cascade", "python", "numpy", "mpi4py", "blake3", "lmcache", "torch", "redis", "h5py", "mooncake")


def _machine(rf: ResultsFile) -> dict | None:
    machine = rf.doc.get("machine")
    return machine if isinstance(machine, dict) else None


def _suite_macros(ctx: Context) -> None:
    """The suite run every number comes from: its directory, commit and repetitions."""
    res = ctx.results
    manifest = res.suite / "manifest.json" if res.suite else None
    src = str(manifest) if manifest is None else f"{display_path(manifest)}"
    commit = res.manifest.get("commit")
    ctx.macros.add("SuiteName", escape(res.suite.name if res.suite else "--"), f"{src}: directory name")
    ctx.macros.add("SuiteCommit", escape(str(commit)[:12]) if isinstance(commit, str) else "unknown",
                   f"{src}: commit")
    reps = res.manifest.get("reps")
    ctx.macros.add("SuiteReps", integer(reps) if isinstance(reps, int) else integer(res.repetitions),
                   f"{src}: reps" if isinstance(reps, int) else "most repetition files of one workload")
    dirty = res.manifest.get("dirty")
    ctx.macros.add("SuiteDirty", "from a clean tree" if dirty is False else
                   "from a tree with uncommitted changes" if dirty is True else "(clean state not recorded)",
                   f"{src}: dirty")
    _device_macro(ctx)


def _device_macro(ctx: Context) -> None:
    """``\\SuiteDevice``: the GPU suite run device_io was read from (empty when none was)."""
    dev = ctx.device
    if dev is None or not ctx.device_used():
        ctx.macros.add("SuiteDevice", "", "no file of a separate GPU suite run was used")
        return
    commit = dev.manifest.get("commit")
    reps = max(len(f.reps) for f in ctx.used if f in dev.files)
    ctx.macros.add("SuiteDevice", r"; \texttt{device\_io}, which needs a GPU this run's machine lacks, comes from "
                   rf"a separate suite run of it alone on a GPU machine, \texttt{{{escape(dev.suite.name)}}} at "
                   rf"commit \texttt{{{escape(str(commit)[:12])}}}, {integer(reps)} repetitions",
                   f"{display_path(dev.suite / 'manifest.json')}: directory name, commit; "
                   "repetitions of its files used")


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
    m.add("ResultsFilesUsed", integer(sum(len(f.reps) for f in used)),
          "count of the repetition files behind Tables/results_files.tex")
    _suite_macros(ctx)

    t = ctx.table("results_files", [("results file", "l"), ("runs", "r"), ("ranks", "r"), ("nodes", "r"),
                                    ("host", "l"), ("CPUs", "r"), ("memory (GiB)", "r"), ("kernel", "l")],
                  used)
    for f in used:
        mach = _machine(f) or {}
        host = mach.get("hostname") or f.doc.get("host") or "--"
        t.add(f"\\texttt{{{escape(f.path.name)}}}", integer(len(f.reps)), integer(f.ranks), integer(f.nodes),
              escape(str(host)),
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
