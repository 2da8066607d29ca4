#!/usr/bin/env bash
# Shows that `make verify` does its job: it passes on a clean copy of this
# tree and fails when a generated file is stale (hand-edited, or not
# regenerated after a type change) or not tracked by git.
#
# The working tree is never touched: tracked and untracked (not ignored)
# files are copied into a temporary git repository and every case runs
# there. Tools come from LOCALBIN (default: bin/ of this tree).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
localbin="${LOCALBIN:-$root/bin}"
crd=config/crd/bases/flashsale.dev_flashsales.yaml
types=api/v1alpha1/flashsale_types.go
deepcopy=api/v1alpha1/zz_generated.deepcopy.go

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Copy the working tree as it would be committed.
cd "$root"
git ls-files -z --cached --others --exclude-standard |
	while IFS= read -r -d '' f; do
		[[ -e "$f" ]] && printf '%s\0' "$f"
	done |
	tar --null -T - -cf - | tar -xf - -C "$work"

cd "$work"
git init -q
git -c user.name=verify-test -c user.email=verify-test@localhost commit -q --allow-empty -m empty
git add -A
git -c user.name=verify-test -c user.email=verify-test@localhost commit -q -m snapshot

failures=0
commit() { git -c user.name=verify-test -c user.email=verify-test@localhost commit -q -am "$1"; }

# run_verify CASE WANT [OUTPUT_PATTERN]: run `make verify` in the copy and
# check that it passes (WANT=pass) or fails printing OUTPUT_PATTERN.
run_verify() {
	local name="$1" want="$2" pattern="${3:-}" out rc=0
	out="$(make --no-print-directory verify LOCALBIN="$localbin" 2>&1)" || rc=$?
	if [[ "$want" == pass && $rc -eq 0 ]] ||
		[[ "$want" == fail && $rc -ne 0 && "$out" =~ $pattern ]]; then
		echo "ok    $name: make verify ${want}ed"
		return
	fi
	echo "FAIL  $name: want make verify to $want${pattern:+ with /$pattern/}, exit code $rc; output:"
	sed 's/^/      /' <<<"$out"
	failures=$((failures + 1))
}

run_verify "clean tree" pass
git tag -f clean >/dev/null

# A hand-edit of the CRD has been committed: regeneration undoes it.
sed -i 's/maxLength: 128/maxLength: 4096/' "$crd"
git diff --quiet -- "$crd" && { echo "FAIL  hand-edit: $crd has no 'maxLength: 128' to edit"; exit 1; }
commit "hand-edit the generated CRD"
run_verify "hand-edited CRD" fail "flashsale\.dev_flashsales\.yaml.*generated files are out of date"
git reset -q --hard clean && git clean -qfd

# An appended line in the generated ClusterRole, committed.
echo "# edited by hand" >>config/rbac/role.yaml
commit "hand-edit the generated ClusterRole"
run_verify "hand-edited ClusterRole" fail "role\.yaml.*generated files are out of date"
git reset -q --hard clean && git clean -qfd

# A type changed without regenerating: the committed CRD is stale.
sed -i 's|+kubebuilder:validation:MaxLength=128|+kubebuilder:validation:MaxLength=64|' "$types"
git diff --quiet -- "$types" && { echo "FAIL  type change: $types has no MaxLength=128 to edit"; exit 1; }
commit "change a type without regenerating"
run_verify "type changed, CRD not regenerated" fail "flashsale\.dev_flashsales\.yaml.*generated files are out of date"
git reset -q --hard clean && git clean -qfd

# The chart's copy of the CRD, edited by hand: make manifests copies it again.
echo "# edited by hand" >>charts/flashsale-operator/crds/flashsale.dev_flashsales.yaml
commit "hand-edit the chart's CRD"
run_verify "hand-edited chart CRD" fail "charts/flashsale-operator/crds/.*generated files are out of date"
git reset -q --hard clean && git clean -qfd

# The install bundle, stale after a change to config/: build-installer
# writes it again.
sed -i 's/terminationGracePeriodSeconds: 40/terminationGracePeriodSeconds: 41/' config/manager/manager.yaml
git diff --quiet -- config/manager/manager.yaml && { echo "FAIL  install bundle: manager.yaml has no grace period to edit"; exit 1; }
commit "change config/manager without rebuilding the installer"
run_verify "stale dist/install.yaml" fail "dist/install\.yaml.*generated files are out of date"
git reset -q --hard clean && git clean -qfd

# The API reference, edited by hand: crd-ref-docs writes it again.
echo "edited by hand" >>docs/reference.md
commit "hand-edit the API reference"
run_verify "hand-edited docs/reference.md" fail "docs/reference\.md.*generated files are out of date"
git reset -q --hard clean && git clean -qfd

# A generated file that git does not track.
git rm -q --cached "$deepcopy"
commit "forget to add the deepcopy file"
run_verify "untracked deepcopy" fail "zz_generated\.deepcopy\.go.*not tracked by git"
git reset -q --hard clean && git clean -qfd

# A built binary committed by mistake (go build at the root).
head -c 2M /dev/urandom >bench
git add -f bench # ignored, as a binary there should be
commit "commit a binary"
run_verify "binary committed" fail "bench.*over 1 MiB"
git reset -q --hard clean && git clean -qfd

run_verify "clean tree again" pass

if ((failures > 0)); then
	echo "verify-test: $failures case(s) failed"
	exit 1
fi
echo "verify-test: make verify passes on a clean tree and fails on stale or untracked generated files and on a committed binary"
