#!/bin/sh
# Installs the tools the deployment tests need:
# - Prometheus' `promtool` (checks deploy/prometheus/*.yaml) and `prometheus` itself (scrapes
#   a live test server end to end): tests/integration/deploy/test_deploy.py;
# - nginx, the balancer in front of three replicas: tests/integration/workers/test_replicas.py
#   (the test writes its own config from deploy/nginx/ and runs it on loopback ports);
# - headless Chromium and its WebDriver, which drive the /docs page (Swagger UI) through
#   Selenium: tests/integration/protocol/test_docs_page.py (never a downloaded browser).
#
# Idempotent: does nothing when all of them are already installed. Otherwise installs
# Debian's `prometheus`, `nginx`, `chromium` and `chromium-driver` packages with apt-get,
# through sudo when not root.
# `make test` runs this first; when it cannot install them (no apt-get, no sudo rights), it
# says why and `make test` goes on: the tests that need them are skipped, each saying why.
#
# The packages' maintainer scripts would start services (Prometheus on :9090, nginx on
# :80); a temporary policy-rc.d forbids that (the tests start their own on free ports), and
# any service that starts anyway (systemd hosts) is stopped and disabled afterwards.
set -eu

# nginx lives in /usr/sbin, which a user's PATH may lack.
have_nginx() {
    command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]
}

PACKAGES=""
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    PACKAGES="prometheus"
fi
if ! have_nginx; then
    PACKAGES="$PACKAGES nginx"
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    PACKAGES="$PACKAGES chromium chromium-driver"
fi
if [ -z "$PACKAGES" ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-tools: promtool/prometheus/nginx/chromium are missing and apt-get is not available;" >&2
    echo "install Prometheus (https://prometheus.io/download/) so both are on PATH, nginx, and" >&2
    echo "Chromium with its chromedriver." >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-test-tools: promtool/prometheus/nginx/chromium are missing; installing them needs root" >&2
        echo "or sudo: run 'apt-get install$PACKAGES' as root, or install Prometheus" >&2
        echo "(https://prometheus.io/download/) so both are on PATH." >&2
        exit 1
    fi
    SUDO="sudo"
fi

echo "install-test-tools: installing Debian's packages:$PACKAGES${SUDO:+ (with sudo)}" >&2

# Forbid service starts during the install, unless the host already has its own policy.
POLICY=/usr/sbin/policy-rc.d
OUR_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    OUR_POLICY=1
fi
cleanup() {
    if [ -n "$OUR_POLICY" ]; then
        $SUDO rm -f "$POLICY"
    fi
}
trap cleanup EXIT

$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
# shellcheck disable=SC2086  # one word per package
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $PACKAGES >/dev/null

# On a systemd host the unit may be enabled and running anyway: the tests don't need it.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    for service in prometheus nginx; do
        $SUDO systemctl disable --now "$service" >/dev/null 2>&1 || true
    done
fi

# Debian puts both in /usr/bin; check they are really reachable now.
for tool in promtool prometheus chromium chromedriver; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "install-test-tools: $tool is still not on PATH after installing" >&2
        exit 1
    fi
done
if ! have_nginx; then
    echo "install-test-tools: nginx is still not installed after installing" >&2
    exit 1
fi
echo "install-test-tools: $(promtool --version 2>&1 | head -n 1)" >&2
