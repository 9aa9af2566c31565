# Sourced by images.sh (see there for what it sets): the pause image,
# test/k8s/images/pause, every test node's sandbox image.
mkdir -p "$out/bin" "$out/stage"
timed pause "$go" build -trimpath -ldflags "-s -w" -o "$out/bin/pause" ./images/pause
cp "$out/bin/pause" "$out/stage/pause"
"$mkimage" -ref "$image_ref" -o "$out/pause.tar" -entrypoint /pause "$out/stage" >&2
rm -rf "$out/stage"
