#!/usr/bin/env bash
# deploy/prometheus through promtool: the scrape config (with the rule files it loads), the
# alert rules, and their unit tests (alerts_test.yml). Exits 77 (skipped) without promtool
# (Debian package `prometheus`, which deploy/setup.sh installs).
#   promtool_check.sh REPO_ROOT
set -euo pipefail
dir=$1/deploy/prometheus
if ! command -v promtool >/dev/null 2>&1; then
  echo "SKIP: promtool not found (apt-get install prometheus, or run deploy/setup.sh)"
  exit 77
fi
promtool --version 2>&1 | head -n 1
promtool check config "$dir/prometheus.yml"
promtool check rules "$dir/alerts.yml"
# Run from the directory: rule_files in the test file are relative to it.
(cd "$dir" && promtool test rules alerts_test.yml)
