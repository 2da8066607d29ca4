#!/usr/bin/env bash
# Builds the node and control-plane binaries that run beside the envtest API
# server on a real test node (internal/testharness.Cluster): kubelet,
# kube-controller-manager, kube-scheduler and kube-proxy, from the
# k8s.io/kubernetes module at the API server's version, with the same module
# trick as hack/build-envtest.sh (the staging modules replaced by their
# published versions), so no prebuilt download is needed.
#
# The binaries land in a cache directory keyed by version, beside the envtest
# binaries; that directory is printed as the last line on stdout:
#
#   FLASHSALE_KUBE_NODE="$(hack/build-kube-node.sh | tail -1)" go test ./test/node/
#
# When the binaries are already cached the script only prints the path.
#
# Environment:
#   KUBE_VERSION     Kubernetes version (default: the one hack/build-envtest.sh uses)
#   FLASHSALE_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/flashsale-operator)
#   GOPROXY, GOFLAGS, GOCACHE, GOMODCACHE and the other go env variables are honoured.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-1.37.2}"

CACHE_ROOT="${FLASHSALE_CACHE:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/flashsale-operator}"
NODE_ROOT="${CACHE_ROOT}/node"
ASSETS_DIR="${NODE_ROOT}/k8s-${KUBE_VERSION}"
BINARIES=(kubelet kube-controller-manager kube-scheduler kube-proxy)

log() {
	printf '[build-kube-node] %s\n' "$*" >&2
}

die() {
	log "error: $*"
	exit 1
}

have_all() {
	local bin
	for bin in "${BINARIES[@]}"; do
		[[ -f "$1/${bin}" && -x "$1/${bin}" ]] || return 1
	done
}

if have_all "${ASSETS_DIR}"; then
	printf '%s\n' "${ASSETS_DIR}"
	exit 0
fi

command -v go >/dev/null 2>&1 || die "go is not on PATH"

[[ "${KUBE_VERSION}" =~ ^1\.([0-9]+)\.([0-9]+)(-[0-9A-Za-z.-]+)?$ ]] ||
	die "KUBE_VERSION must look like 1.MINOR.PATCH, got '${KUBE_VERSION}'"
KUBE_MAJOR=1
KUBE_MINOR="${BASH_REMATCH[1]}"
STAGING_VERSION="0.${KUBE_VERSION#1.}"

mkdir -p "${NODE_ROOT}"

# Serialise concurrent builds; the second one finds the cache filled.
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

WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/flashsale-kube-node.XXXXXX")"
STAGE_DIR="$(mktemp -d "${ASSETS_DIR}.tmp.XXXXXX")"

export GOWORK=off
export CGO_ENABLED=0

field() {
	sed -n "s/^[[:space:]]*\"$2\": \"\(.*\)\",\{0,1\}\$/\1/p" "$1" | head -n 1
}

START_SECONDS="${SECONDS}"
log "building node binaries: Kubernetes v${KUBE_VERSION} (staging v${STAGING_VERSION})"
log "downloading k8s.io/kubernetes@v${KUBE_VERSION}"
(cd "${WORK_DIR}" && go mod download -json "k8s.io/kubernetes@v${KUBE_VERSION}") >"${WORK_DIR}/kubernetes.json" ||
	die "go mod download k8s.io/kubernetes@v${KUBE_VERSION} failed: $(cat "${WORK_DIR}/kubernetes.json")"
K8S_GOMOD="$(field "${WORK_DIR}/kubernetes.json" GoMod)"
K8S_DIR="$(field "${WORK_DIR}/kubernetes.json" Dir)"
K8S_INFO="$(field "${WORK_DIR}/kubernetes.json" Info)"
[[ -f "${K8S_GOMOD}" && -d "${K8S_DIR}/cmd" ]] || die "no source found for k8s.io/kubernetes@v${KUBE_VERSION}"

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

K8S_GO_VERSION="$(awk '$1 == "go" { print $2; exit }' "${K8S_GOMOD}")"
BUILD_DATE="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${K8S_INFO}" 2>/dev/null || true)"
BUILD_DATE="${BUILD_DATE:-1970-01-01T00:00:00Z}"
KUBE_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	KUBE_LDFLAGS+=" -X ${pkg}.gitVersion=v${KUBE_VERSION}"
	KUBE_LDFLAGS+=" -X ${pkg}.gitMajor=${KUBE_MAJOR}"
	KUBE_LDFLAGS+=" -X ${pkg}.gitMinor=${KUBE_MINOR}"
	KUBE_LDFLAGS+=" -X ${pkg}.gitTreeState=clean"
	KUBE_LDFLAGS+=" -X ${pkg}.gitCommit="
	KUBE_LDFLAGS+=" -X ${pkg}.buildDate=${BUILD_DATE}"
done

# One helper module holds the four commands, so their shared packages are
# compiled once in one go build.
MOD="${WORK_DIR}/node"
mkdir -p "${MOD}"
{
	printf 'module kubenode.local\n\ngo %s\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "${K8S_GO_VERSION}" "${KUBE_VERSION}"
	for mod in "${STAGING_MODULES[@]}"; do
		printf '\t%s => %s v%s\n' "${mod}" "${mod}" "${STAGING_VERSION}"
	done
	printf ')\n'
} >"${MOD}/go.mod"
# The commands' main files, verbatim from the module.
declare -A MAIN=(
	[kubelet]=kubelet/kubelet.go
	[kube-controller-manager]=kube-controller-manager/controller-manager.go
	[kube-scheduler]=kube-scheduler/scheduler.go
	[kube-proxy]=kube-proxy/proxy.go
)
for bin in "${BINARIES[@]}"; do
	mkdir -p "${MOD}/${bin}"
	cp "${K8S_DIR}/cmd/${MAIN[${bin}]}" "${MOD}/${bin}/main.go"
	chmod 0644 "${MOD}/${bin}/main.go"
done
log "compiling ${BINARIES[*]}"
pkgs=()
for bin in "${BINARIES[@]}"; do
	pkgs+=("./${bin}")
done
(cd "${MOD}" && go build -mod=mod -trimpath -ldflags "${KUBE_LDFLAGS}" -o "${STAGE_DIR}/" "${pkgs[@]}") ||
	die "building ${BINARIES[*]} failed"

for bin in "${BINARIES[@]}"; do
	"${STAGE_DIR}/${bin}" --version >"${WORK_DIR}/${bin}-version" 2>&1 ||
		die "${bin} --version failed: $(cat "${WORK_DIR}/${bin}-version")"
	grep -q "v${KUBE_VERSION}\$" "${WORK_DIR}/${bin}-version" ||
		die "${bin} reports '$(cat "${WORK_DIR}/${bin}-version")', want v${KUBE_VERSION}"
done

chmod 0755 "${STAGE_DIR}" "${STAGE_DIR}"/*
if [[ -e "${ASSETS_DIR}" ]]; then
	OLD_DIR="$(mktemp -d "${ASSETS_DIR}.old.XXXXXX")"
	mv -T "${ASSETS_DIR}" "${OLD_DIR}/dir"
fi
mv -T "${STAGE_DIR}" "${ASSETS_DIR}"

log "built in $((SECONDS - START_SECONDS))s: ${ASSETS_DIR}"
printf '%s\n' "${ASSETS_DIR}"
