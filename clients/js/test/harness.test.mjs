// The harness itself: whatever happens to a test, what it started does not
// outlive it, and the suite goes on. A test that overruns its bound fails,
// says what it was waiting for, keeps its pods' logs, and is cleaned up,
// and the next test runs; a test process killed outright (SIGKILL) takes
// its herald and redis-server with it. (Before, a file that overran was
// killed mid-test without its cleanup, and a herald it had started kept the
// runner waiting until it was killed by hand.)

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { JS_ROOT, bounded, poll, test } from './harness.mjs';

/** Whether `pid` is a live process (a zombie is dead: it only waits to be reaped). */
function running(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Kills what a failed story left, so that a failure leaves nothing either. */
function reaper(t, pids) {
  t.after(() => {
    for (const pid of pids) if (running(pid)) process.kill(pid, 'SIGKILL');
  });
}

/**
 * `node args` from the SDK's directory, in a process group of its own: its
 * output so far, its exit, and `kill()` (SIGKILL to the group: the runner
 * and the file it runs), which the story calls when it ends.
 */
function node(t, args, env = {}) {
  // Without the runner's mark on this file's process, or `node --test` would not run files.
  const { NODE_TEST_CONTEXT: _, ...inherited } = process.env;
  const child = spawn(process.execPath, args, {
    cwd: JS_ROOT,
    env: { ...inherited, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  const run = { child, out: '' };
  run.kill = () => {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      // Gone already.
    }
  };
  t.after(run.kill);
  child.stdout.on('data', (d) => (run.out += d));
  child.stderr.on('data', (d) => (run.out += d));
  run.exited = once(child, 'exit').then(([code, signal]) => code ?? signal);
  return run;
}

const started = (out) => /started: (\d+) (\d+)/.exec(out)?.slice(1).map(Number);

test('a test that overruns its bound fails, says what it waited for, keeps its logs and leaves no process; the next test runs', async (t) => {
  const BOUND = 3000;
  const run = node(t, ['--test', '--test-concurrency=1', '--test-force-exit', '--test-reporter=tap', 'test/fixtures/overrun.mjs'], {
    OVERRUN_BOUND_MS: String(BOUND),
  });
  // Its bound, and the time to start a Redis and a pod, and to clean up;
  // well short of the 60 s its wait would last unbounded.
  const code = await bounded('the file with the overrunning test to end', 30_000, run.exited);
  const pids = started(run.out);
  assert.ok(pids, `it started a redis-server and a herald:\n${run.out}`);
  reaper(t, pids);
  assert.notEqual(code, 0, `a timed-out test fails the run:\n${run.out}`);
  assert.match(run.out, /not ok 1 - a test that overruns its bound/);
  assert.match(run.out, /timed out after 3000ms/);
  assert.match(run.out, /timed out while waiting for a message that never comes/);
  assert.match(run.out, /ok 2 - the next test/);
  const logs = /the pods' logs are in (\S+)/.exec(run.out)?.[1];
  assert.ok(logs && existsSync(logs), `its pods' logs are kept:\n${run.out}`);
  assert.ok(readdirSync(logs).some((f) => f.startsWith('herald-')), readdirSync(logs).join(' '));
  rmSync(logs, { recursive: true, force: true });
  for (const pid of pids) assert.equal(running(pid), false, `pid ${pid} ended with its test`);
});

test('a test process killed with SIGKILL leaves no herald or redis-server running', async (t) => {
  const logs = mkdtempSync(join(tmpdir(), 'herald-js-victim-'));
  t.after(() => rmSync(logs, { recursive: true, force: true }));
  const run = node(t, ['test/fixtures/victim.mjs'], { VICTIM_LOGS: logs });
  const pids = await poll('the victim to start a redis-server and a herald', 30_000, async () => started(run.out));
  reaper(t, pids);
  assert.ok(pids.every(running), `${pids} run`);
  // The test process alone (its group would take the children with it).
  run.child.kill('SIGKILL');
  await run.exited;
  await poll('what the victim started to end', 10_000, async () => !pids.some(running)).catch(() => {
    assert.fail(`still running after the test process died: ${pids.filter(running)}`);
  });
});
