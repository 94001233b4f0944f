#!/bin/sh
# Install the TeX the paper's PDF needs, once: pdflatex, bibtex, the LaTeX packages main.tex
# uses, and pdftotext (tests/test_paper.py reads the PDF back). Debian/Ubuntu texlive
# packages, without recommends (about 25 packages; under a minute on a fresh Debian 12 machine).
# Quick no-op when everything is there. Run as root or with passwordless sudo.
set -eu
PACKAGES="texlive-latex-base texlive-latex-recommended texlive-fonts-recommended lmodern poppler-utils"
STYLES="booktabs.sty caption.sty mathptmx.sty hyperref.sty xspace.sty geometry.sty t1lmtt.fd"

have_all() {
    for tool in pdflatex bibtex kpsewhich pdftotext pdfinfo; do
        command -v "$tool" >/dev/null 2>&1 || return 1
    done
    for style in $STYLES; do
        [ -n "$(kpsewhich "$style" 2>/dev/null)" ] || return 1
    done
}

if have_all; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-tex.sh: no apt-get here; install pdflatex, bibtex, the LaTeX packages ($STYLES) and poppler's pdftotext yourself" >&2
    exit 2
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install-tex.sh: need root (or passwordless sudo) to apt-get install $PACKAGES" >&2
        exit 2
    fi
fi
echo "install-tex.sh: apt-get install $PACKAGES" >&2
$SUDO apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -y -q install --no-install-recommends $PACKAGES >/dev/null
have_all || { echo "install-tex.sh: installed $PACKAGES but something is still missing" >&2; exit 1; }
