"""Build ``main.pdf`` from the paper's sources and generated files, and check it.

    python -m paper.pdf [--dir DIR]      (make -C paper pdf runs the figures first)

``DIR`` (default ``paper/``) must hold ``Figures/``, ``Tables/`` and ``Generated/`` from
``python -m paper.figures --out DIR``; the TeX sources and ``refs.bib`` are copied there
when ``DIR`` is not ``paper/`` itself. Runs pdflatex, bibtex, pdflatex twice, and fails
when LaTeX stops, a reference or citation stays undefined, or BibTeX reports an error.
Needs pdflatex and bibtex (``paper/install-tex.sh`` installs them on Debian/Ubuntu).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

PAPER_DIR = Path(__file__).resolve().parent
SOURCES = ("main.tex", "1. Introduction.tex", "2. Background.tex", "3. Design.tex", "4. Evaluation.tex", "refs.bib")
UNDEFINED = re.compile(r"(LaTeX|Package natbib) Warning: (Reference|Citation) .* undefined"
                       r"|There were undefined references")


class PdfError(Exception):
    """The PDF could not be built or has unresolved references; the message says why."""


def _run(cmd: list[str], cwd: Path, log: str) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, errors="replace", timeout=300)
    if done.returncode:
        tail = (cwd / log).read_text(errors="replace")[-3000:] if (cwd / log).exists() else done.stdout[-3000:]
        raise PdfError(f"{' '.join(cmd)} failed ({done.returncode}) in {cwd}:\n{tail}")


def build(directory: Path = PAPER_DIR) -> Path:
    """``directory/main.pdf``, built and checked (:class:`PdfError` otherwise)."""
    directory = Path(directory).resolve()
    for tool in ("pdflatex", "bibtex"):
        if shutil.which(tool) is None:
            raise PdfError(f"{tool} not found: run paper/install-tex.sh (Debian/Ubuntu texlive packages)")
    if directory != PAPER_DIR:
        for name in SOURCES:
            shutil.copy(PAPER_DIR / name, directory / name)
    for stale in ("main.aux", "main.bbl", "main.blg", "main.out", "main.toc"):
        (directory / stale).unlink(missing_ok=True)
    latex = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "main.tex"]
    _run(latex, directory, "main.log")
    _run(["bibtex", "main"], directory, "main.blg")
    _run(latex, directory, "main.log")
    _run(latex, directory, "main.log")
    log = (directory / "main.log").read_text(errors="replace")
    problems = [line for line in log.splitlines() if UNDEFINED.search(line)]
    blg = (directory / "main.blg").read_text(errors="replace")
    problems += [line for line in blg.splitlines() if line.startswith(("Warning--I didn't find", "I couldn't open"))]
    if re.search(r"There (was|were) \d+ error messages?", blg):
        problems.append("bibtex reported errors (see main.blg)")
    if problems:
        raise PdfError("unresolved in the PDF:\n" + "\n".join(problems))
    return directory / "main.pdf"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.pdf", description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=PAPER_DIR, help="directory with the generated files (default %(default)s)")
    args = p.parse_args(argv)
    try:
        pdf = build(args.dir)
    except PdfError as exc:
        print(f"paper.pdf: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {pdf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
