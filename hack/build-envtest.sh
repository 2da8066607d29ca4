#!/usr/bin/env bash
# Builds the binaries that controller-runtime's envtest needs (kube-apiserver,
# etcd and kubectl) from their Go modules, so no prebuilt download is needed.
#
# The binaries land in a cache directory keyed by version; that directory is
# printed as the last line on stdout and is the value for KUBEBUILDER_ASSETS:
#
#   KUBEBUILDER_ASSETS="$(hack/build-envtest.sh)" go test ./...
#
# When the binaries are already cached the script only prints the path. The
# first build compiles kube-apiserver from source and takes several minutes.
#
# Environment:
#   KUBE_VERSION     Kubernetes version (k8s.io/kubernetes v$KUBE_VERSION, k8s.io/* staging modules v0.MINOR.PATCH)
#   ETCD_VERSION     etcd version (go.etcd.io/etcd/server/v3 v$ETCD_VERSION)
#   FLASHSALE_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/flashsale-operator)
#   GOPROXY, GOFLAGS, GOCACHE, GOMODCACHE and the other go env variables are honoured.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"

CACHE_ROOT="${FLASHSALE_CACHE:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/flashsale-operator}"
ENVTEST_ROOT="${CACHE_ROOT}/envtest"
ASSETS_DIR="${ENVTEST_ROOT}/k8s-${KUBE_VERSION}-etcd-${ETCD_VERSION}"
BINARIES=(kube-apiserver etcd kubectl)

log() {
	printf '[build-envtest] %s\n' "$*" >&2
}

die() {
	log "error: $*"
	exit 1
}

# have_all DIR: true when every binary exists in DIR and is executable.
have_all() {
	local bin
	for bin in "${BINARIES[@]}"; do
		[[ -f "$1/${bin}" && -x "$1/${bin}" ]] || return 1
	done
}

# Fast path: nothing to build.
if have_all "${ASSETS_DIR}"; then
	printf '%s\n' "${ASSETS_DIR}"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "go is not on PATH"

[[ "${KUBE_VERSION}" =~ ^1\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]] ||
	die "KUBE_VERSION must look like 1.MINOR.PATCH, got '${KUBE_VERSION}'"
KUBE_MAJOR=1
KUBE_MINOR="${BASH_REMATCH[1]}"
# The staging repositories (k8s.io/api, k8s.io/client-go, ...) are tagged
# v0.MINOR.PATCH for Kubernetes v1.MINOR.PATCH.
STAGING_VERSION="0.${KUBE_VERSION#1.}"
[[ "${ETCD_VERSION}" =~ ^3\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
	die "ETCD_VERSION must look like 3.MINOR.PATCH, got '${ETCD_VERSION}'"

mkdir -p "${ENVTEST_ROOT}"

# Serialise concurrent builds of the same versions; the second one finds the
# cache filled by the first.
if command -v flock >/dev/null 2>&1; then
	exec 9>"${ASSETS_DIR}.lock"
	if ! flock -n 9; then
		log "another build of ${ASSETS_DIR##*/} is running; waiting for it"
		flock 9
	fi
	if have_all "${ASSETS_DIR}"; then
		printf '%s\n' "${ASSETS_DIR}"
		exit 0
	fi
	# Holding the lock, leftovers of a killed build can go.
	rm -rf "${ASSETS_DIR}".tmp.* "${ASSETS_DIR}".old.*
fi

WORK_DIR=""
STAGE_DIR=""
OLD_DIR=""
cleanup() {
	local dir
	for dir in "${WORK_DIR}" "${STAGE_DIR}" "${OLD_DIR}"; do
		if [[ -n "${dir}" ]]; then
			rm -rf "${dir}"
		fi
	done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/flashsale-envtest.XXXXXX")"
# Built next to the final directory (same file system) so that the final
# rename is atomic: an interrupted build never leaves a half-filled cache.
STAGE_DIR="$(mktemp -d "${ASSETS_DIR}.tmp.XXXXXX")"

# The helper modules live outside any repository and workspace; -mod=mod lets
# `go build` fill in go.mod and go.sum from the module proxy. GOFLAGS from the
# environment still applies; flags on the command line take precedence.
export GOWORK=off
export CGO_ENABLED=0
GO_BUILD=(go build -mod=mod -trimpath)

# field JSON_FILE NAME: the string value of "NAME" in `go mod download -json` output.
field() {
	sed -n "s/^[[:space:]]*\"$2\": \"\(.*\)\",\{0,1\}\$/\1/p" "$1" | head -n 1
}

# download MODULE@VERSION OUT_JSON: downloads a module, keeps its JSON description.
download() {
	log "downloading $1"
	(cd "${WORK_DIR}" && go mod download -json "$1") >"$2" ||
		die "go mod download $1 failed: $(cat "$2")"
}

# new_module DIR MODULE_PATH GO_VERSION: starts a helper module's go.mod.
new_module() {
	mkdir -p "$1"
	printf 'module %s\n\ngo %s\n' "$2" "$3" >"$1/go.mod"
}

START_SECONDS="${SECONDS}"
GO_VERSION_LOCAL="$(go env GOVERSION)"
GO_VERSION_LOCAL="${GO_VERSION_LOCAL#go}"
GO_VERSION_LOCAL="${GO_VERSION_LOCAL%%[!0-9.]*}"
log "building envtest binaries: Kubernetes v${KUBE_VERSION} (staging v${STAGING_VERSION}), etcd v${ETCD_VERSION}, go ${GO_VERSION_LOCAL}"

# ---------------------------------------------------------------- kube-apiserver
download "k8s.io/kubernetes@v${KUBE_VERSION}" "${WORK_DIR}/kubernetes.json"
K8S_GOMOD="$(field "${WORK_DIR}/kubernetes.json" GoMod)"
K8S_INFO="$(field "${WORK_DIR}/kubernetes.json" Info)"
[[ -n "${K8S_GOMOD}" && -f "${K8S_GOMOD}" ]] || die "no go.mod found for k8s.io/kubernetes@v${KUBE_VERSION}"

# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them
# with directories inside its own tree; replaces of a dependency are ignored,
# so the helper module maps each of them to its published version.
STAGING_MODULES=()
while IFS= read -r mod; do
	STAGING_MODULES+=("${mod}")
done < <(
	awk '
		/^require[[:space:]]*\(/ { inblock = 1; next }
		inblock && /^\)/ { inblock = 0; next }
		/^require[[:space:]]+[^(]/ { sub(/^require[[:space:]]+/, ""); print; next }
		inblock { print }
	' "${K8S_GOMOD}" |
		awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' |
		sort -u
)
((${#STAGING_MODULES[@]} > 0)) || die "no k8s.io/* v0.0.0 requirements found in ${K8S_GOMOD}"
log "k8s.io/kubernetes lists ${#STAGING_MODULES[@]} staging modules; replacing each with v${STAGING_VERSION}"

# Build with at least the language version k8s.io/kubernetes declares, so the
# same GODEBUG defaults apply as in an upstream build.
K8S_GO_VERSION="$(awk '$1 == "go" { print $2; exit }' "${K8S_GOMOD}")"
K8S_GO_VERSION="${K8S_GO_VERSION:-${GO_VERSION_LOCAL}}"

# Version stamping as in kubernetes' hack/lib/version.sh; the apiserver derives
# its binary and default emulation version from gitVersion.
BUILD_DATE="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${K8S_INFO}" 2>/dev/null || true)"
BUILD_DATE="${BUILD_DATE:-1970-01-01T00:00:00Z}"
KUBE_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	KUBE_LDFLAGS+=" -X ${pkg}.gitVersion=v${KUBE_VERSION}"
	KUBE_LDFLAGS+=" -X ${pkg}.gitMajor=${KUBE_MAJOR}"
	KUBE_LDFLAGS+=" -X ${pkg}.gitMinor=${KUBE_MINOR}"
	KUBE_LDFLAGS+=" -X ${pkg}.gitTreeState=clean"
	# No commit is known for a module build; without this the placeholder
	# "$Format:%H$" shows up in `kubectl version` and the apiserver's /version.
	KUBE_LDFLAGS+=" -X ${pkg}.gitCommit="
	KUBE_LDFLAGS+=" -X ${pkg}.buildDate=${BUILD_DATE}"
done

APISERVER_MOD="${WORK_DIR}/kube-apiserver"
new_module "${APISERVER_MOD}" envtest.local/kube-apiserver "${K8S_GO_VERSION}"
{
	printf '\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "${KUBE_VERSION}"
	for mod in "${STAGING_MODULES[@]}"; do
		printf '\t%s => %s v%s\n' "${mod}" "${mod}" "${STAGING_VERSION}"
	done
	printf ')\n'
} >>"${APISERVER_MOD}/go.mod"
# Same as cmd/kube-apiserver/apiserver.go in k8s.io/kubernetes.
cat >"${APISERVER_MOD}/main.go" <<'EOF'
package main

import (
	"os"
	_ "time/tzdata" // for timeZone support in CronJob

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
EOF
log "compiling kube-apiserver (the slow part)"
(cd "${APISERVER_MOD}" && "${GO_BUILD[@]}" -ldflags "${KUBE_LDFLAGS}" -o "${STAGE_DIR}/kube-apiserver" .) ||
	die "building kube-apiserver failed"

# ----------------------------------------------------------------------- kubectl
KUBECTL_MOD="${WORK_DIR}/kubectl"
new_module "${KUBECTL_MOD}" envtest.local/kubectl "${K8S_GO_VERSION}"
printf '\nrequire (\n\tk8s.io/client-go v%s\n\tk8s.io/component-base v%s\n\tk8s.io/kubectl v%s\n)\n' \
	"${STAGING_VERSION}" "${STAGING_VERSION}" "${STAGING_VERSION}" >>"${KUBECTL_MOD}/go.mod"
# Same as cmd/kubectl/kubectl.go in k8s.io/kubernetes.
cat >"${KUBECTL_MOD}/main.go" <<'EOF'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Import to initialize client auth plugins.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
EOF
log "compiling kubectl"
(cd "${KUBECTL_MOD}" && "${GO_BUILD[@]}" -ldflags "${KUBE_LDFLAGS}" -o "${STAGE_DIR}/kubectl" .) ||
	die "building kubectl failed"

# -------------------------------------------------------------------------- etcd
download "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" "${WORK_DIR}/etcd.json"
ETCD_GOMOD="$(field "${WORK_DIR}/etcd.json" GoMod)"
ETCD_GO_VERSION="$(awk '$1 == "go" { print $2; exit }' "${ETCD_GOMOD}" 2>/dev/null || true)"
ETCD_MOD="${WORK_DIR}/etcd"
new_module "${ETCD_MOD}" envtest.local/etcd "${ETCD_GO_VERSION:-${GO_VERSION_LOCAL}}"
printf '\nrequire go.etcd.io/etcd/server/v3 v%s\n' "${ETCD_VERSION}" >>"${ETCD_MOD}/go.mod"
# Same as main.go at the root of the etcd repository.
cat >"${ETCD_MOD}/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
EOF
log "compiling etcd"
(cd "${ETCD_MOD}" && "${GO_BUILD[@]}" -ldflags "-s -w" -o "${STAGE_DIR}/etcd" .) ||
	die "building etcd failed"

# ------------------------------------------------------------------------ verify
"${STAGE_DIR}/kube-apiserver" --version >"${WORK_DIR}/apiserver-version" 2>&1 ||
	die "kube-apiserver --version failed: $(cat "${WORK_DIR}/apiserver-version")"
grep -qx "Kubernetes v${KUBE_VERSION}" "${WORK_DIR}/apiserver-version" ||
	die "kube-apiserver reports '$(cat "${WORK_DIR}/apiserver-version")', want 'Kubernetes v${KUBE_VERSION}'"
"${STAGE_DIR}/etcd" --version >"${WORK_DIR}/etcd-version" 2>&1 ||
	die "etcd --version failed: $(cat "${WORK_DIR}/etcd-version")"
grep -q "etcd Version: ${ETCD_VERSION}" "${WORK_DIR}/etcd-version" ||
	die "etcd reports '$(cat "${WORK_DIR}/etcd-version")', want version ${ETCD_VERSION}"
"${STAGE_DIR}/kubectl" version --client >"${WORK_DIR}/kubectl-version" 2>&1 ||
	die "kubectl version --client failed: $(cat "${WORK_DIR}/kubectl-version")"

# ------------------------------------------------------------------------- place
chmod 0755 "${STAGE_DIR}" "${STAGE_DIR}"/*
if [[ -e "${ASSETS_DIR}" ]]; then
	# A partial or damaged cache from an older version of this script or a
	# manual edit: move it aside, then swap the new one in.
	OLD_DIR="$(mktemp -d "${ASSETS_DIR}.old.XXXXXX")"
	mv -T "${ASSETS_DIR}" "${OLD_DIR}/dir"
fi
mv -T "${STAGE_DIR}" "${ASSETS_DIR}"

log "built in $((SECONDS - START_SECONDS))s: ${ASSETS_DIR}"
printf '%s\n' "${ASSETS_DIR}"
