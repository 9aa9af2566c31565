# Sourced by images.sh (see there for what it sets): the cluster DNS image,
# a minimal CoreDNS (test/k8s/coredns, its own module) with the Corefile
# baked in at /etc/coredns/Corefile, which a ConfigMap mounted there
# replaces.
mkdir -p "$out/bin" "$out/stage/etc/coredns"
timed "coredns $coredns_version" \
	bash -c 'cd coredns && "$0" build -trimpath -ldflags "-s -w" -o "$1" .' "$go" "$out/bin/coredns"
cp "$out/bin/coredns" "$out/stage/coredns"
cp coredns/Corefile "$out/stage/etc/coredns/Corefile"
cp coredns/Corefile "$out/Corefile"
"$mkimage" -ref "$image_ref" -o "$out/coredns.tar" -entrypoint /coredns \
	-cmd -conf -cmd /etc/coredns/Corefile "$out/stage" >&2
rm -rf "$out/stage"
