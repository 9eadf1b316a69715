# helm test: GET $ENDPOINT/models until it answers (a model load takes minutes), then require
# $EXPECT_MODEL among the ids. POSIX sh + curl only (the curl image has no jq or bash).
set -u
deadline=$(( $(date +%s) + ${TIMEOUT_SECONDS:-600} ))
while :; do
  if [ -n "${API_KEY:-}" ]; then
    body=$(curl -fsS --max-time 10 -H "Authorization: Bearer ${API_KEY}" "${ENDPOINT}/models")
  else
    body=$(curl -fsS --max-time 10 "${ENDPOINT}/models")
  fi
  status=$?
  [ "$status" -eq 0 ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "FAIL: ${ENDPOINT}/models did not answer within ${TIMEOUT_SECONDS:-600}s (curl exit ${status})"
    exit 1
  fi
  sleep "${RETRY_SECONDS:-5}"
done
echo "${ENDPOINT}/models answered: ${body}"
# One id per line, then an exact match: "autoglm-phone-9b" must not match "autoglm-phone-9b-x".
ids=$(printf '%s' "$body" | tr ',{}[]' '\n\n\n\n\n' | sed -n 's/^ *"id" *: *"\(.*\)" *$/\1/p')
if printf '%s\n' "$ids" | grep -Fxq -- "$EXPECT_MODEL"; then
  echo "PASS: model ${EXPECT_MODEL} is served"
else
  echo "FAIL: model ${EXPECT_MODEL} not in /v1/models ids: $(printf '%s ' $ids)"
  exit 1
fi
