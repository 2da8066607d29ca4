#!/usr/bin/env bash
# Builds one of the project's release and docs tools from its Go module at a
# pinned version, so no prebuilt download is needed, and caches it:
#
#   hack/build-tool.sh helm          # prints the binary's path as the last line
#   "$(hack/build-tool.sh promtool | tail -1)" check rules ...
#
# Tools (name: module, version variable):
#   helm          helm.sh/helm/v3/cmd/helm                 HELM_VERSION
#   promtool      github.com/prometheus/prometheus/cmd/promtool  PROMETHEUS_VERSION
#   crd-ref-docs  github.com/elastic/crd-ref-docs          CRD_REF_DOCS_VERSION
#   golangci-lint hack/tools/golangci-kal (golangci-lint v2 with kube-api-linter
#                 linked in as a module plugin; versions pinned in its go.mod)
#   monitoring-crds  the Prometheus Operator's ServiceMonitor, PodMonitor and
#                 PrometheusRule CRDs, from github.com/prometheus-operator/prometheus-operator
#                 (PROMETHEUS_OPERATOR_VERSION): files, not a binary; the last
#                 line is their directory. The chart's apply test validates
#                 against them.
#
# When the binary is cached the script only prints its path. Environment:
#   FLASHSALE_CACHE  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/flashsale-operator)
#   GOPROXY, GOFLAGS, GOCACHE, GOMODCACHE and the other go env variables are honoured.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
CRD_REF_DOCS_VERSION="${CRD_REF_DOCS_VERSION:-v0.3.0}"
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"

log() { printf '[build-tool] %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[[ $# -eq 1 ]] || die "usage: $0 helm|promtool|crd-ref-docs|golangci-lint|monitoring-crds"
name="$1"
ldflags="-s -w"
tags=""
# Set for a tool built from a module in this repository rather than PKG@VERSION.
src=""
case "${name}" in
helm)
	pkg=helm.sh/helm/v3/cmd/helm version="${HELM_VERSION}"
	# What `helm version` prints; helm's own Makefile stamps it the same way.
	ldflags+=" -X helm.sh/helm/v3/internal/version.version=${version}"
	;;
promtool)
	pkg=github.com/prometheus/prometheus/cmd/promtool version="${PROMETHEUS_VERSION}"
	ldflags+=" -X github.com/prometheus/common/version.Version=${version#v}"
	# Rule checks and rule unit tests need no service discovery: leaving the
	# cloud SDKs out (Prometheus's own build tag) saves most of the build.
	tags=remove_all_sd
	;;
crd-ref-docs)
	pkg=github.com/elastic/crd-ref-docs version="${CRD_REF_DOCS_VERSION}"
	;;
golangci-lint)
	# What `golangci-lint custom` would build, without its git clone: the
	# small module in hack/tools/golangci-kal links golangci-lint and the
	# kubeapilinter plugin. The cache key is golangci-lint's version plus a
	# hash of that module, so bumping either pin rebuilds.
	src="$(cd "$(dirname "${BASH_SOURCE[0]}")/tools/golangci-kal" && pwd)"
	pkg=github.com/golangci/golangci-lint/v2
	version="$(awk -v m="${pkg}" '$1 == m { print $2 }' "${src}/go.mod")"
	[[ -n "${version}" ]] || die "no ${pkg} version in ${src}/go.mod"
	version+="-kal-$(cat "${src}/go.mod" "${src}/go.sum" "${src}"/*.go | sha256sum | cut -c1-12)"
	;;
monitoring-crds)
	pkg=github.com/prometheus-operator/prometheus-operator version="${PROMETHEUS_OPERATOR_VERSION}"
	;;
*) die "unknown tool '${name}' (helm, promtool, crd-ref-docs, golangci-lint or monitoring-crds)" ;;
esac

CACHE_ROOT="${FLASHSALE_CACHE:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/flashsale-operator}"
DIR="${CACHE_ROOT}/tools/${name}-${version}${tags:+-${tags}}"
BIN="${DIR}/${name}"
if [[ "${name}" == monitoring-crds ]]; then
	# Files: the directory stands for the binary, and a marker written last
	# for its executable bit.
	BIN="${DIR}"
	[[ -f "${DIR}/.complete" ]] && { printf '%s\n' "${DIR}"; exit 0; }
fi

if [[ "${name}" != monitoring-crds && -x "${BIN}" ]]; then
	printf '%s\n' "${BIN}"
	exit 0
fi
command -v go >/dev/null 2>&1 || die "go is not on PATH"
mkdir -p "${CACHE_ROOT}/tools"

# Serialise concurrent builds of the same tool; the second finds it built.
if command -v flock >/dev/null 2>&1; then
	exec 9>"${DIR}.lock"
	flock 9
	if [[ -x "${BIN}" && ( "${name}" != monitoring-crds || -f "${DIR}/.complete" ) ]]; then
		printf '%s\n' "${BIN}"
		exit 0
	fi
fi

STAGE="$(mktemp -d "${DIR}.tmp.XXXXXX")"
trap 'rm -rf "${STAGE}"' EXIT
start="${SECONDS}"
if [[ "${name}" == monitoring-crds ]]; then
	log "fetching ${pkg}@${version} for its CRDs (first time only)"
	mod="$(cd "${STAGE}" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "${pkg}@${version}" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')" || die "downloading ${pkg}@${version} failed"
	[[ -d "${mod}" ]] || die "go mod download gave no directory for ${pkg}@${version}"
	for kind in servicemonitors podmonitors prometheusrules; do
		cp "${mod}/example/prometheus-operator-crd/monitoring.coreos.com_${kind}.yaml" "${STAGE}/" ||
			die "${pkg}@${version} has no ${kind} CRD"
	done
	touch "${STAGE}/.complete"
	rm -rf "${DIR}"
	mv -T "${STAGE}" "${DIR}"
	log "fetched ${name} in $((SECONDS - start))s: ${DIR}"
	printf '%s\n' "${DIR}"
	exit 0
fi
if [[ -n "${src}" ]]; then
	log "building ${name} ${version} from ${src} (first time only)"
	(cd "${src}" && GOWORK=off CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath -mod=readonly" \
		go build -ldflags "${ldflags}" -o "${STAGE}/${name}" .) || die "building ${name} failed"
else
	log "building ${name} from ${pkg}@${version} (first time only)"
	# Outside any module and workspace: go install PKG@VERSION uses the tool's
	# own go.mod and go.sum, as its maintainers test it.
	(cd "${STAGE}" && GOWORK=off CGO_ENABLED=0 GOBIN="${STAGE}" GOFLAGS="${GOFLAGS:-} -trimpath" \
		go install -tags "${tags}" -ldflags "${ldflags}" "${pkg}@${version}") || die "building ${name} failed"
fi
[[ -x "${STAGE}/${name}" ]] || die "go install left no ${name} binary"
rm -rf "${DIR}"
mv -T "${STAGE}" "${DIR}"
log "built ${name} in $((SECONDS - start))s: ${BIN}"
printf '%s\n' "${BIN}"
