# skip REASON...: ends a test that cannot run here, visibly: prints "SKIP: REASON" and writes a
# JUnit report with one <skipped> case to $XML_OUTPUT_FILE, which tests/summarize.py counts as
# skipped, not passed. Then exits 0 (Bazel's verdict; the report says what happened).
skip() {
  echo "SKIP: $*"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    local msg target=${TEST_TARGET:-test} name
    name=${target##*:}
    msg=$(printf '%s' "$*" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g')
    cat >"$XML_OUTPUT_FILE" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="${target#//}" tests="1" failures="0" errors="0" skipped="1">
    <testcase name="$name" classname="$(dirname "${target#//}" | tr / .)" time="0">
      <skipped message="$msg"/>
    </testcase>
  </testsuite>
</testsuites>
XML
  fi
  exit 0
}
