#!/usr/bin/env bash
# A vendored crate is crates.io's crate with vendor/NAME.patch applied,
# nothing else (why, for each: vendor/NAME.md). This script makes and
# checks that tree.
#
#   vendor/crate.sh check NAME           vendor/NAME is exactly NAME <the
#                                        version in its Cargo.toml> +
#                                        vendor/NAME.patch (CI runs this for
#                                        every vendored crate)
#   vendor/crate.sh update NAME VERSION  replace vendor/NAME with NAME
#                                        VERSION + the patch (then `cargo
#                                        update -p NAME`, build, test)
#
# The crate comes from static.crates.io and is checked against the sha256
# that crates.io's index records for it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# index_path NAME: the crate's file in crates.io's sparse index
index_path() {
  local name=$1
  case ${#name} in
    1) echo "1/$name" ;;
    2) echo "2/$name" ;;
    3) echo "3/${name:0:1}/$name" ;;
    *) echo "${name:0:2}/${name:2:2}/$name" ;;
  esac
}

# fetch NAME VERSION DIR: the pristine crate, verified, patched, in DIR/NAME
fetch() {
  local name=$1 version=$2 dir=$3
  local want got
  want=$(curl -sSf "https://index.crates.io/$(index_path "$name")" | python3 -c '
import json, sys
for line in sys.stdin:
    v = json.loads(line)
    if v["vers"] == sys.argv[1]:
        print(v["cksum"])' "$version")
  [ -n "$want" ] || { echo "crate.sh: crates.io has no $name $version" >&2; exit 1; }
  curl -sSfL -o "$dir/$name.crate" "https://static.crates.io/crates/$name/$name-$version.crate"
  got=$(sha256sum "$dir/$name.crate" | cut -d' ' -f1)
  [ "$got" = "$want" ] || { echo "crate.sh: $name $version: sha256 $got, the index says $want" >&2; exit 1; }
  tar -xzf "$dir/$name.crate" -C "$dir"
  mv "$dir/$name-$version" "$dir/$name"
  # The crate's own lock file: the .gitignore keeps it out of git, and
  # cargo ignores it for a dependency.
  rm -f "$dir/$name/Cargo.lock"
  (cd "$dir/$name" && patch -s -p1 --no-backup-if-mismatch <"$here/$name.patch")
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
name=${2:-}
[ -n "$name" ] && [ -f "$here/$name.patch" ] || usage
case "${1:-}" in
  check)
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/$name/Cargo.toml" | head -n 1)
    fetch "$name" "$version" "$work"
    if ! diff -r "$work/$name" "$here/$name" >"$work/diff"; then
      echo "crate.sh: vendor/$name is not $name $version + vendor/$name.patch:" >&2
      head -n 40 "$work/diff" >&2
      exit 1
    fi
    echo "vendor/$name is $name $version + vendor/$name.patch"
    ;;
  update)
    version=${3:?usage: vendor/crate.sh update NAME VERSION}
    fetch "$name" "$version" "$work"
    rm -rf "${here:?}/$name"
    mv "$work/$name" "$here/$name"
    echo "vendor/$name is now $name $version + vendor/$name.patch; run cargo update -p $name"
    ;;
  *) usage ;;
esac
