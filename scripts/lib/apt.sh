# Sourced by the scripts that install what a fresh Debian machine lacks.
#
# apt_install PKG...: installs the packages not installed yet (as root, or through sudo).
# Prints what it installs on stderr; returns 1 with a message when apt-get is not available.
apt_install() {
    local missing=() pkg sudo=""
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || {
        printf 'missing packages: %s (install them; there is no apt-get here)\n' "${missing[*]}" >&2
        return 1
    }
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    printf 'installing %s\n' "${missing[*]}" >&2
    $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
