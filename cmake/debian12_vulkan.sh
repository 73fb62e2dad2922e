#!/usr/bin/env bash
# Vulkan build and test prerequisites on Debian 12, whose own packages fall short: its Vulkan
# headers (1.3.239) are older than ggml-vulkan needs (1.3.275), and its lavapipe (Mesa 22.3, the
# CPU Vulkan driver) crashes in its own worker thread on the engine's first decode. Debian 13's
# libvulkan-dev and spirv-headers (header-only) and bookworm-backports' Mesa 25 lavapipe are
# unpacked into DEST; nothing outside DEST changes besides Debian 12's own glslc, libvulkan-dev
# and spirv-headers, installed with apt. The mirror is the one the system's apt sources name.
#
#   bash cmake/debian12_vulkan.sh [DEST]     # default: $XDG_CACHE_HOME/uma-serve/vulkan
#
# then, as it prints:
#   CMAKE_ARGS="-DUMA_BACKEND=vulkan -DVulkan_INCLUDE_DIR=DEST/usr/include" pip install .
#   VK_DRIVER_FILES=DEST/lvp_icd.json LD_LIBRARY_PATH=DEST/usr/lib/x86_64-linux-gnu \
#     GGML_VK_VISIBLE_DEVICES=0 pytest       # lavapipe, taken by ggml only when named
set -euo pipefail
DEST=$(realpath -m "${1:-${XDG_CACHE_HOME:-$HOME/.cache}/uma-serve/vulkan}")
arch=$(dpkg --print-architecture)

missing=""
for p in glslc libvulkan-dev spirv-headers; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  apt-get -o Acquire::Retries=3 update -qq \
    && apt-get -o Acquire::Retries=3 install -y -qq $missing >/dev/null
fi

if [ ! -f "$DEST/lvp_icd.json" ]; then
  mirror=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null \
           | head -1)
  [ -n "$mirror" ] || mirror=$(sed -n 's/^deb \(\[[^]]*\] \)\?\([^ ]*\/debian\) .*/\2/p' \
                                /etc/apt/sources.list 2>/dev/null | head -1)
  [ -n "$mirror" ] || { echo "no Debian mirror in the apt sources" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lists/partial" "$tmp/debs"
  key=/usr/share/keyrings/debian-archive-keyring.gpg
  {
    echo "deb [signed-by=$key] $mirror trixie main"
    echo "deb [signed-by=$key] $mirror bookworm-backports main"
  } > "$tmp/sources.list"
  # retries: CI runs this on every fresh clone, and one dropped download should not fail it
  o=(-o Acquire::Retries=3 -o Dir::Etc::SourceList="$tmp/sources.list"
     -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$tmp/lists" -o APT::Architecture="$arch"
     -o APT::Architectures="$arch" -o APT::Sandbox::User=root)
  apt-get "${o[@]}" update -qq
  (cd "$tmp/debs" && apt-get "${o[@]}" download -qq libvulkan-dev/trixie spirv-headers/trixie \
     mesa-vulkan-drivers/bookworm-backports libdrm2/bookworm-backports)
  mkdir -p "$DEST"
  for f in "$tmp"/debs/*.deb; do dpkg -x "$f" "$DEST"; done
  lib="$DEST/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
  sed "s#\"libvulkan_lvp.so\"#\"$lib/libvulkan_lvp.so\"#" \
    "$DEST/usr/share/vulkan/icd.d/lvp_icd.json" > "$DEST/lvp_icd.json"
fi
lib="$DEST/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
echo "CMAKE_ARGS=\"-DUMA_BACKEND=vulkan -DVulkan_INCLUDE_DIR=$DEST/usr/include\""
echo "VK_DRIVER_FILES=$DEST/lvp_icd.json LD_LIBRARY_PATH=$lib GGML_VK_VISIBLE_DEVICES=0"
