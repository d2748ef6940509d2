#!/usr/bin/env python3
"""tools/k8s-test-server/build.sh takes the package archive from the machine's apt configuration, not
from a host name of its own: with a private APT_CONFIG naming a made-up mirror (one-line sources.list,
then deb822 .sources), `build.sh --print-archive` prints that mirror, for the release's own suite.

Usage: k8s_archive_test.py REPO
"""
import os
import subprocess
import sys
import tempfile

REPO = os.path.abspath(sys.argv[1])
failed = 0


def archive(conf_dir):
    env = dict(os.environ, APT_CONFIG=os.path.join(conf_dir, "apt.conf"),
               TEXTGEN_K8S_CACHE=os.path.join(conf_dir, "cache"))  # never a real cached binary
    r = subprocess.run(["bash", os.path.join(REPO, "tools/k8s-test-server/build.sh"), "--print-archive"],
                       env=env, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout.strip(), r.stderr[-300:]


def expect(what, got, want):
    global failed
    if got != want:
        failed += 1
        print(f"FAIL: {what}: got {got}, want {want}", flush=True)


def main():
    codename = subprocess.run(["bash", "-c", ". /etc/os-release && echo $VERSION_CODENAME"],
                              capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as d:
        parts = os.path.join(d, "parts")
        os.mkdir(parts)
        with open(os.path.join(d, "apt.conf"), "w") as f:
            f.write(f'Dir::Etc::SourceList "{d}/sources.list";\nDir::Etc::SourceParts "{parts}";\n')
        # A security suite listed first must not be taken for the archive.
        with open(os.path.join(parts, "security.sources"), "w") as f:
            f.write(f"Types: deb\nURIs: http://security.mirror.example/debian-security\n"
                    f"Suites: {codename}-security\nComponents: main\n")
        with open(os.path.join(d, "sources.list"), "w") as f:
            f.write(f"deb http://mirror.example/debian {codename} main\n")
        expect("one-line sources.list", archive(d), (0, "http://mirror.example/debian/", ""))
        os.remove(os.path.join(d, "sources.list"))
        with open(os.path.join(parts, "debian.sources"), "w") as f:
            f.write(f"Types: deb\nURIs: http://other.mirror.example/debian\nSuites: {codename} {codename}-updates\n"
                    "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
        expect("deb822 .sources", archive(d), (0, "http://other.mirror.example/debian/", ""))
        os.remove(os.path.join(parts, "debian.sources"))
        code, out, err = archive(d)
        expect("no archive for the release: exit 1, named", (code, out, "no archive for release" in err), (1, "", True))
    print("ok" if not failed else f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
