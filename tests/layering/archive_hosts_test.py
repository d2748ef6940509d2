#!/usr/bin/env python3
"""No package archive, registry or model hub host name is written in the repository: tools derive them
from the machine's own configuration (apt's sources, npm's and pip's defaults), as
tools/k8s-test-server/build.sh does. Scans every tracked file and every new file git does not ignore.

Usage: archive_hosts_test.py REPO
ALLOWED lists the (file, host) pairs that are justified, each with its reason; an entry that no
longer matches fails too, so the list cannot go stale.
"""
import os
import re
import subprocess
import sys

REPO = os.path.abspath(sys.argv[1])

# Host names of package archives, language registries, container registries and model hubs.
HOSTS = re.compile(r"(?<![\w.-])(" + "|".join([
    r"(?:[\w-]+\.)*debian\.org",                 # deb., security., ftp.xx., snapshot. ...
    r"(?:[\w-]+\.)*ubuntu\.com",                 # archive., security., ports. ...
    r"(?:[\w-]+\.)*launchpad(?:content)?\.net",
    r"registry\.npmjs\.org", r"(?:www\.)?npmjs\.(?:com|org)", r"registry\.yarnpkg\.com",
    r"(?:upload\.|test\.)?pypi\.org", r"(?:files\.)?pythonhosted\.org", r"download\.pytorch\.org",
    r"(?:[\w-]+\.)*anaconda\.(?:org|com)", r"proxy\.golang\.org", r"sum\.golang\.org",
    r"(?:static\.)?crates\.io", r"repo1?\.maven\.org", r"rubygems\.org",
    r"developer\.download\.nvidia\.com", r"nvcr\.io",
    r"(?:[\w-]+\.)*docker\.(?:io|com)", r"ghcr\.io", r"quay\.io", r"(?:[\w-]+\.)*gcr\.io",
    r"registry\.k8s\.io", r"k8s\.gcr\.io", r"get\.helm\.sh", r"dl\.k8s\.io",
    r"(?:[\w-]+\.)*huggingface\.co", r"hf\.co",
]) + r")(?![\w-]|\.\w)", re.I)

# Hosts are spelled with "[.]" here so that this file passes its own scan.
ALLOWED = {
    # The launcher's hub endpoint default is Hugging Face's, as in TGI and huggingface_hub
    # (HF_ENDPOINT overrides it): serving `--model-id org/name` depends on it.
    ("launcher/include/textgen/launcher/hub.h", "huggingface[.]co"): "TGI's HF_ENDPOINT default",
    ("launcher/src/hub.cpp", "huggingface[.]co"): "TGI's HF_ENDPOINT default",
}


def files():
    try:
        out = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
        names = sorted({n.decode() for n in out.split(b"\0") if n})
    except (OSError, subprocess.CalledProcessError):  # a source tarball: walk it
        names = []
        for root, dirs, fs in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in (".git", "node_modules") and not d.startswith("build")]
            names += [os.path.relpath(os.path.join(root, f), REPO) for f in fs]
    return [n for n in names if os.path.isfile(os.path.join(REPO, n))]


def main():
    found, failures = set(), []
    for name in files():
        with open(os.path.join(REPO, name), "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue  # binary (weights, archives)
        for lineno, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            for m in HOSTS.finditer(line):
                host = m.group(1).lower()
                if (name, host.replace(".", "[.]")) in ALLOWED:
                    found.add((name, host.replace(".", "[.]")))
                else:
                    failures.append(f"{name}:{lineno}: {host}: {line.strip()[:160]}")
    for f in failures:
        print("FAIL: host name written in the repository (derive it from the machine's configuration):", f)
    for key in sorted(set(ALLOWED) - found):
        print(f"FAIL: allowlist entry no longer needed: {key}")
        failures.append(key)
    print(f"{len(files())} files scanned, {len(found)} allowed uses, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
