#!/usr/bin/env bash
# Build mship's images with one version tag across the variants: mship:<version>-control,
# mship:<version>-cpu, mship:<version>-cuda (<version> from pyproject.toml).
#
#   docker/build.sh                      # all three
#   docker/build.sh cpu cuda             # just these
#   docker/build.sh cpu -- --build-arg PIP_EXTRA_INDEX_URL=http://mirror.local/simple
#
# Everything after `--` goes to `docker build` as is. IMAGE=registry.example/mship names the
# repository (default mship); DOCKER=podman (or any docker-compatible CLI) runs the builds.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image="${IMAGE:-mship}"
docker_cli="${DOCKER:-docker}"
all_variants=(control cpu cuda)

# The [project] table's version: awk, so building needs no particular Python on the host.
version="$(awk -F'"' '/^\[/ { in_project = ($0 == "[project]") }
                      in_project && /^version[[:space:]]*=/ { print $2; exit }' "$root/pyproject.toml")"
if [[ -z "$version" ]]; then
    echo "build.sh: no version in the [project] table of $root/pyproject.toml" >&2
    exit 1
fi

variants=()
extra=()
while (($#)); do
    case "$1" in
        --) shift; extra=("$@"); break ;;
        control|cpu|cuda) variants+=("$1"); shift ;;
        -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build.sh: unknown variant '$1' (known: ${all_variants[*]})" >&2; exit 2 ;;
    esac
done
((${#variants[@]})) || variants=("${all_variants[@]}")

# The commit for the revision label; "unknown" outside a git checkout.
revision="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"

for variant in "${variants[@]}"; do
    tag="$image:$version-$variant"
    echo "build.sh: building $tag from docker/Dockerfile.$variant" >&2
    "$docker_cli" build \
        --file "$root/docker/Dockerfile.$variant" \
        --build-arg "MSHIP_VERSION=$version" \
        --build-arg "VCS_REF=$revision" \
        --tag "$tag" \
        ${extra[@]+"${extra[@]}"} \
        "$root"
done
