#!/usr/bin/env bash
# The tests start their own Postgres and Redis from the local binaries, run
# `docker-compose config`, and drive Debian's chromium headless for the console (tests/browser);
# this makes sure the binaries exist. As root it installs Debian's packages; otherwise it says how.
set -euo pipefail

have_postgres() {
  command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}
have_redis() { command -v redis-server >/dev/null 2>&1; }
# `docker-compose config` checks docker-compose.yml (tests/unit/test_compose_file.py).
have_compose() { command -v docker-compose >/dev/null 2>&1; }
have_chromium() { [ -x /usr/bin/chromium ]; }

missing=()
have_postgres || missing+=(postgresql)
have_redis || missing+=(redis-server)
have_compose || missing+=(docker-compose)
have_chromium || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing ${missing[*]} (Debian packages) for the tests"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "missing for the integration tests: ${missing[*]}" >&2
  echo "install with: sudo apt-get install ${missing[*]}" >&2
  echo "(locally those tests are skipped; with CI set they fail)" >&2
fi
