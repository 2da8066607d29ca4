#!/usr/bin/env bash
# Installs the Debian packages that the build and the tests need: Redis
# (server and redis-cli), PostgreSQL (server and client), git, make, procps,
# util-linux (setpriv, for the test API server; nsenter, for the test node;
# prlimit, for a reserve process test), CA certificates, a C compiler with
# the C library headers (go test -race needs cgo), and what the test node
# runs beside the kubelet: containerd, runc, the CNI plugins (bridge,
# host-local, loopback), iptables and conntrack for kube-proxy, and iproute2
# for its network namespace. Packages already present are left alone, so a
# second run does nothing and prints nothing.
set -euo pipefail

# package:command that proves it is installed ("" = ask dpkg)
checks=(
	"redis-server:redis-server"
	"redis-tools:redis-cli"
	"postgresql:"
	"ca-certificates:"
	"git:git"
	"make:make"
	"procps:ps"
	"util-linux:setpriv"
	"gcc:gcc"
	"libc6-dev:"
	"containerd:containerd"
	"runc:runc"
	"containernetworking-plugins:"
	"iptables:iptables"
	"conntrack:conntrack"
	"iproute2:ip"
)

have_postgres() {
	# Debian puts the server outside $PATH, in /usr/lib/postgresql/VERSION/bin.
	local d
	for d in /usr/lib/postgresql/*/bin; do
		[[ -x $d/initdb && -x $d/postgres ]] && command -v psql >/dev/null && return 0
	done
	return 1
}

missing=()
for entry in "${checks[@]}"; do
	pkg=${entry%%:*} cmd=${entry#*:}
	case $pkg in
	postgresql) have_postgres && continue ;;
	*)
		if [[ -n $cmd ]]; then
			command -v "$cmd" >/dev/null && continue
		else
			dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' && continue
		fi
		;;
	esac
	missing+=("$pkg")
done

[[ ${#missing[@]} -eq 0 ]] && exit 0

install=(apt-get install -y --no-install-recommends "${missing[@]}")
if [[ $(id -u) -eq 0 ]]; then
	sudo=(env)
elif command -v sudo >/dev/null; then
	sudo=(sudo env)
else
	echo "install-deps: missing packages: ${missing[*]}; run as root:" >&2
	echo "  apt-get update && DEBIAN_FRONTEND=noninteractive ${install[*]}" >&2
	exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { "${sudo[@]}" DEBIAN_FRONTEND=noninteractive apt-get update &&
	"${sudo[@]}" DEBIAN_FRONTEND=noninteractive "${install[@]}"; } >"$log" 2>&1; then
	cat "$log" >&2
	echo "install-deps: failed to install: ${missing[*]}" >&2
	exit 1
fi
