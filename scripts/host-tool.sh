#!/bin/sh
# Print the path of one of the workspace's host tools (a debug binary such as k3os-images or
# k3os-oci) after building it with `cargo build -p <package> --bin <bin>`.
#
#   host-tool.sh <package> <bin>
#
# With K3OS_HOST_TOOLS_BUILT=1 it builds nothing and requires the binary to exist: `just test`
# sets it after its builds phase, whose `cargo test --workspace --no-run` has built every binary
# of the workspace. A `cargo build -p <package>` would resolve the dependencies' features for
# that package alone (no dev-dependencies), which differ from the test build's, and compile
# tokio, hyper, serde and the rest of its graph a second time.
set -eu
[ $# = 2 ] || { echo "usage: host-tool.sh <package> <bin>" >&2; exit 2; }
t="${CARGO_TARGET_DIR:-target}"
if [ "${K3OS_HOST_TOOLS_BUILT:-}" = 1 ]; then
    [ -x "$t/debug/$2" ] || {
        echo "host-tool.sh: K3OS_HOST_TOOLS_BUILT=1, but $t/debug/$2 was not built (run \`cargo test --workspace --no-run\` first, or unset it)" >&2
        exit 1
    }
else
    cargo build -p "$1" --bin "$2" >&2
fi
echo "$t/debug/$2"
