# Shared by the command-line tools' shell tests (source it after setting bin and tmp): fail,
# expect_ok, expect_bad, expect_exit, expect_out, expect_clean and finish. Every check records a
# failure and goes on, so a run lists all that is wrong.
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_ok NAME ARGS...: exit code 0; stdout in $tmp/out.
expect_ok() {
  local name=$1
  shift
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    fail "$name: exit code $rc, want 0; stderr: $(cat "$tmp/err")"
    return 1
  fi
  return 0
}

# expect_bad NAME MESSAGE ARGS...: exit code 2, MESSAGE (a fixed string) on stderr, empty stdout.
expect_bad() {
  local name=$1 message=$2
  shift 2
  expect_exit "$name" 2 "$message" "$@"
}

# expect_exit NAME CODE MESSAGE ARGS...: exit code CODE, MESSAGE (a fixed string) on stderr, empty
# stdout.
expect_exit() {
  local name=$1 code=$2 message=$3
  shift 3
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$code" ]; then
    fail "$name: exit code $rc, want $code; stderr: $(cat "$tmp/err")"
  elif ! grep -qF -- "$message" "$tmp/err"; then
    fail "$name: stderr lacks \"$message\": $(cat "$tmp/err")"
  elif [ -s "$tmp/out" ]; then
    fail "$name: printed to stdout on error: $(cat "$tmp/out")"
  fi
}

# expect_out NAME TEXT: the last successful run printed TEXT (a fixed string).
expect_out() {
  grep -qF -- "$2" "$tmp/out" || fail "$1: stdout lacks \"$2\": $(cat "$tmp/out")"
}

# A name holding an ESC (a terminal escape), a newline and U+009B (a terminal's CSI), and the
# name as kiln's messages write it (quoted.h's Escaped).
odd=$'odd\e[31m\n\xc2\x9b2J'
odd_escaped='odd\x1b[31m\n\u009b2J'

# expect_clean NAME [FILE]: FILE (by default the last run's stderr, $tmp/err; $tmp/out for its
# stdout) is one line, with no raw ESC and no raw U+009B.
expect_clean() {
  local file=${2:-$tmp/err} what
  case $file in
    "$tmp/err") what=stderr ;;
    "$tmp/out") what=stdout ;;
    *) what=$file ;;
  esac
  if LC_ALL=C grep -q $'\e' "$file"; then
    fail "$1: a raw ESC on $what: $(cat -v "$file")"
  elif LC_ALL=C grep -q $'\xc2\x9b' "$file"; then
    fail "$1: a raw U+009B on $what: $(cat -v "$file")"
  elif [ "$(wc -l <"$file")" -ne 1 ]; then
    fail "$1: $what is not one line: $(cat -v "$file")"
  fi
}

# finish: exit 1 with the count of failed checks, or print PASS.
finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed" >&2
    exit 1
  fi
  echo "PASS"
}
