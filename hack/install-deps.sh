#!/usr/bin/env bash
# System packages the tests and the demo need, from Debian. Idempotent; quiet when all present.
set -euo pipefail
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v openssl >/dev/null || need+=(openssl)
# The Kubernetes build needs a current Go (1.24+), not Debian's older golang-go.
command -v go >/dev/null || { echo "[deps] Go 1.24 or newer is required on PATH" >&2; exit 1; }
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
echo "[deps] installing ${need[*]} from Debian ..." >&2
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Installing Debian's prometheus starts and enables its service, which is not wanted: tests
# start their own Prometheus on loopback. Stop and disable only that service, and only when this
# run installed it; a Prometheus that was already there is the user's and is left alone.
case " ${need[*]} " in
  *" prometheus "*)
    $sudo invoke-rc.d prometheus stop || echo "[deps] could not stop the prometheus service" >&2
    $sudo update-rc.d prometheus disable ||
      echo "[deps] could not disable the prometheus service" >&2
    ;;
esac
