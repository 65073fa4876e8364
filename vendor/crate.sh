#!/usr/bin/env bash
# The vendored h2 is crates.io's h2 with vendor/h2.patch applied, nothing
# else (why: vendor/h2.md). This script makes and checks that tree.
#
#   vendor/h2.sh check           vendor/h2 is exactly h2 <the version in its
#                                Cargo.toml> + vendor/h2.patch (CI runs this)
#   vendor/h2.sh update VERSION  replace vendor/h2 with h2 VERSION + the patch
#                                (then `cargo update -p h2`, build, test)
#
# The crate comes from static.crates.io and is checked against the sha256
# that crates.io's index records for it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
patch_file=$here/h2.patch

# fetch VERSION DIR: the pristine crate, verified, patched, in DIR/h2
fetch() {
  local version=$1 dir=$2
  local want got
  want=$(curl -sSf https://index.crates.io/2/h2 | python3 -c '
import json, sys
for line in sys.stdin:
    v = json.loads(line)
    if v["vers"] == sys.argv[1]:
        print(v["cksum"])' "$version")
  [ -n "$want" ] || { echo "h2.sh: crates.io has no h2 $version" >&2; exit 1; }
  curl -sSfL -o "$dir/h2.crate" "https://static.crates.io/crates/h2/h2-$version.crate"
  got=$(sha256sum "$dir/h2.crate" | cut -d' ' -f1)
  [ "$got" = "$want" ] || { echo "h2.sh: h2 $version: sha256 $got, the index says $want" >&2; exit 1; }
  tar -xzf "$dir/h2.crate" -C "$dir"
  mv "$dir/h2-$version" "$dir/h2"
  # The crate's own lock file: its .gitignore keeps it out of git, and cargo
  # ignores it for a dependency.
  rm -f "$dir/h2/Cargo.lock"
  (cd "$dir/h2" && patch -s -p1 --no-backup-if-mismatch <"$patch_file")
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "${1:-}" in
  check)
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/h2/Cargo.toml" | head -n 1)
    fetch "$version" "$work"
    if ! diff -r "$work/h2" "$here/h2" >"$work/diff"; then
      echo "h2.sh: vendor/h2 is not h2 $version + vendor/h2.patch:" >&2
      head -n 40 "$work/diff" >&2
      exit 1
    fi
    echo "vendor/h2 is h2 $version + vendor/h2.patch"
    ;;
  update)
    version=${2:?usage: vendor/h2.sh update VERSION}
    fetch "$version" "$work"
    rm -rf "$here/h2"
    mv "$work/h2" "$here/h2"
    echo "vendor/h2 is now h2 $version + vendor/h2.patch; run cargo update -p h2"
    ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
