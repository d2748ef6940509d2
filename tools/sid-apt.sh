# Sourced by the scripts that fetch what Debian 12 lacks from Debian unstable (sid): a private apt
# configuration over sid, with its own lists, cache and an empty status file, so nothing is
# installed system-wide and dependency resolution lists everything. The archive is the one this
# machine's own apt configuration names for its release (apt parses sources.list and
# sources.list.d/*.sources itself; APT_CONFIG is honoured): no archive host name is written in
# this repository (../shared/notes/toolchain.md).
#
#   . tools/sid-apt.sh
#   sid_apt_setup "$work" [deb-src]   # sets the array apt_opts and reads sid's package lists
#   apt-get "${apt_opts[@]}" download NAME

# The archive URI of this machine's release.
archive_uri() {
  local codename uri
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  uri=$(apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)' |
    awk -v rel="$codename" '$2 == rel {print $1; exit}')
  [ -n "$uri" ] || { log "no archive for release '$codename' in this machine's apt sources"; return 1; }
  echo "$uri"
}

# sid_apt_setup WORK [deb-src]: a private apt configuration under WORK/apt (with source package
# lists too when asked), then `apt-get update` on it.
sid_apt_setup() {
  local work=$1 with_src=${2:-} archive
  local apt_dir=$work/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
  : >"$apt_dir/status"
  archive=$(archive_uri)
  log "using the archive this machine's apt configuration names: $archive (suite sid)"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive sid main" \
    >"$apt_dir/sources.list"
  if [ "$with_src" = deb-src ]; then
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $archive sid main" \
      >>"$apt_dir/sources.list"
  fi
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::State::Status=$apt_dir/status"
    -o "Dir::Cache=$apt_dir" -o "Dir::Cache::archives=$apt_dir/archives"
    -o "APT::Architecture=amd64" -o "Debug::NoLocking=1" -o "APT::Get::List-Cleanup=0")
  log "reading Debian unstable's package lists"
  apt-get "${apt_opts[@]}" update >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; return 1; }
}
