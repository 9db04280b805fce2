# Sourced by the benchmark scripts that run jobs in the background: start a job's processes,
# wait for them under a deadline, stop them, and clean up on exit. Written once here so that
# every script stops and times out the same way.
#
# The caller keeps the leaders' pids in the array `pids` (set `pids=()` first) and sets
# run_timeout (seconds) before gradwire_wait_job; job_poll_s is how often it looks (0.2 s).

# Ends every process group in `pids` (each started by setsid), TERM then KILL, and empties it.
gradwire_kill_job() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  sleep 2
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}

# gradwire_start_job LOG cmd...: runs cmd in a session of its own (so that its whole process
# group can be stopped), output to LOG, and adds it to `pids`.
gradwire_start_job() {
  local log=$1
  shift
  setsid "$@" >"$log" 2>&1 </dev/null &
  pids+=($!)
}

# gradwire_wait_job: waits for every started process; the first failure (or the deadline,
# run_timeout + 20 s) stops the rest. Returns the first non-zero status, 124 on the deadline.
gradwire_wait_job() {
  local deadline=$((SECONDS + run_timeout + 20)) status=0 alive pid i rc
  while :; do
    alive=0
    for i in "${!pids[@]}"; do
      pid=${pids[$i]}
      [ -n "$pid" ] || continue
      if kill -0 "$pid" 2>/dev/null; then
        alive=1
      else
        rc=0
        wait "$pid" || rc=$?
        pids[$i]=""
        [ "$rc" = 0 ] || [ "$status" != 0 ] || status=$rc
      fi
    done
    [ "$alive" = 1 ] || break
    if [ "$status" != 0 ] || [ $SECONDS -ge $deadline ]; then
      [ "$status" != 0 ] || status=124
      local live=()
      for pid in "${pids[@]}"; do [ -z "$pid" ] || live+=("$pid"); done
      pids=("${live[@]}")
      gradwire_kill_job
      break
    fi
    sleep "${job_poll_s:-0.2}"
  done
  pids=()
  return "$status"
}

# gradwire_cleanup_on_exit HOOK: on exit (and on INT/TERM, as status 130) stops what is
# still running, then runs HOOK (the script's own cleanup: a cluster to take down, files),
# and exits with the status the script had.
gradwire_cleanup_on_exit() {
  gradwire_job_cleanup_hook=$1
  trap gradwire_job_cleanup EXIT
  trap 'exit 130' INT TERM
}
gradwire_job_cleanup() {
  local status=$?
  trap - EXIT INT TERM
  [ ${#pids[@]} -eq 0 ] || gradwire_kill_job
  "$gradwire_job_cleanup_hook" || true  # its failure must not replace the status the script ends with
  exit "$status"
}
