// Browser tests of the Starling viewer: a real `starling serve` on
// 127.0.0.1 with the built viewer, Debian chromium driven by npm
// playwright-core. Run by `cargo xtask test`, which sets:
//   STARLING_BIN       the starling binary
//   STARLING_WEB_DIR   the built viewer (web-client/dist)
//   STARLING_ARTIFACTS where screenshots go
//   CHROMIUM           the browser (default /usr/bin/chromium)
// Every wait is for a condition, bounded by a timeout.

import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const BIN = process.env.STARLING_BIN;
const WEB = process.env.STARLING_WEB_DIR;
const ARTIFACTS = process.env.STARLING_ARTIFACTS ?? 'artifacts';
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const WAIT_MS = 30_000;

if (!BIN || !WEB) {
  throw new Error('set STARLING_BIN and STARLING_WEB_DIR (cargo xtask test does)');
}
mkdirSync(ARTIFACTS, { recursive: true });
console.log(`screenshots go to ${ARTIFACTS}`);

let browser;
const servers = [];

before(async () => {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox', '--use-angle=swiftshader', '--enable-unsafe-swiftshader',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--no-first-run', '--disable-quic',
    ],
  });
});

// Each test's servers and nats-servers stop when it ends: a debug server
// left stepping its flock (up to 100k boids) would load every later test
// on a two-core machine.
afterEach(async () => {
  for (const s of servers.splice(0)) await s.stop();
});

after(async () => {
  await browser?.close();
  for (const s of servers) await s.stop();
});

/** Starts `starling serve` on 127.0.0.1:0 and waits for its URL. */
async function startServer(extra = [], command = ['serve']) {
  const population = extra.includes('--population') || command[0] !== 'serve' ? [] : ['--population', '2000'];
  const bind = extra.includes('--bind') ? [] : ['--bind', '127.0.0.1:0'];
  const proc = spawn(BIN, [...command, ...bind, '--web-dir', WEB, ...population, ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: 'warn' },
  });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server printed no URL in ${WAIT_MS} ms: ${log}`)), WAIT_MS);
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/ at (http:\/\/127\.0\.0\.1:\d+)\//);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`the server exited (${code}): ${log}`)); });
  });
  const server = {
    url,
    async stop() {
      if (proc.exitCode !== null) return;
      const exited = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      const timeout = new Promise((r) => setTimeout(r, 10_000, 'timeout'));
      if ((await Promise.race([exited, timeout])) === 'timeout') proc.kill('SIGKILL');
    },
  };
  servers.push(server);
  return server;
}

async function rest(server, path, init = {}) {
  const res = await fetch(server.url + '/api/v1' + path, init);
  const body = await res.text();
  assert.ok(res.ok, `${init.method ?? 'GET'} ${path}: ${res.status} ${body}`);
  return body.startsWith('[') || body.startsWith('{') ? JSON.parse(body) : body;
}

const post = (server, path, body, token) => rest(server, path, {
  method: 'POST',
  headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
  body: JSON.stringify(body ?? {}),
});

/** Polls `f` until it returns a truthy value. */
async function until(what, f, ms = WAIT_MS) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    last = await f();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what} (last: ${JSON.stringify(last)})`);
}

async function openViewer(server, query = '') {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(server.url + '/' + query);
  await until('frames on the page', async () => Number(await page.locator('#st-frames').innerText()) >= 3);
  assert.deepEqual(errors, [], 'no script errors');
  return page;
}

const number = async (page, sel) => Number(await page.locator(sel).innerText());

/** The canvas downsampled to brightness values. */
const pixels = (page) => page.evaluate(() => {
  const c = document.getElementById('view');
  const t = document.createElement('canvas');
  t.width = 320; t.height = 200;
  const g = t.getContext('2d');
  g.drawImage(c, 0, 0, 320, 200);
  const d = g.getImageData(0, 0, 320, 200).data;
  const out = [];
  for (let i = 0; i < d.length; i += 4) out.push(d[i] + d[i + 1] + d[i + 2]);
  return out;
});

const shot = (page, name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`) });

test('the page loads, draws the flock with WebGL2 and the flock moves', async () => {
  const server = await startServer();
  const page = await openViewer(server);
  const gl2 = await page.evaluate(() => document.getElementById('view').getContext('webgl2') !== null);
  assert.ok(gl2, 'the canvas has a WebGL2 context');
  assert.equal(await page.locator('#st-boids').innerText(), '2000');
  // Not blank: a few hundred lit pixels (boids and the world box), once
  // the first frames are drawn (a loaded machine draws them late).
  const litIn = (px) => px.filter((v) => v > 200).length;
  const a = await until('the flock drawn', async () => {
    const px = await pixels(page);
    return litIn(px) > 200 ? px : null;
  });
  await shot(page, 'flock-1');
  // The status line is redrawn twice a second. The tick is read first: read
  // after the frames, it could come from the next redraw, which may already
  // count the ten more frames awaited below, and the tick compared would be
  // the same one (a CI run failed so).
  const tick = await number(page, '#st-tick');
  const frames = await number(page, '#st-frames');
  await until('more frames', async () => (await number(page, '#st-frames')) >= frames + 10);
  assert.ok((await number(page, '#st-tick')) > tick, 'the tick shown advances');
  const b = await pixels(page);
  await shot(page, 'flock-2');
  const changed = a.filter((v, i) => Math.abs(v - b[i]) > 30).length;
  assert.ok(changed > 100, `only ${changed} pixels changed: the flock does not move`);
  assert.match(await page.locator('#st-conn').innerText(), /live/);
  await page.close();
});

test('a weight slider changes the value the REST API reports', async () => {
  const server = await startServer();
  const page = await openViewer(server);
  const before = (await rest(server, '/params')).w_ali;
  // Sliders take input once the server's schema (labels, defaults) is in.
  await until('the schema', async () => (await page.locator('#param-w_ali').getAttribute('data-default')) !== null);
  // Move the slider as a user would: input events while dragging, change on release.
  await page.evaluate(() => {
    const s = document.getElementById('param-w_ali');
    s.value = '600';
    s.dispatchEvent(new Event('input', { bubbles: true }));
    s.dispatchEvent(new Event('change', { bubbles: true }));
  });
  const shown = Number(await page.locator('#value-w_ali').innerText());
  assert.notEqual(shown, before);
  await until('REST reports the new w_ali', async () => (await rest(server, '/params')).w_ali === shown);
  await until('the ack on the page', async () => /parameter change: done/.test(await page.locator('#message').innerText()));
  await page.close();
});

test('the sliders have human labels, tooltips and groups, start at their middle, and presets show which is active', async () => {
  const server = await startServer();
  const page = await openViewer(server);
  // Labels with units, the help line as a tooltip, from the server's schema.
  const label = (name) => page.locator(`label[for=param-${name}]`).innerText();
  await until('the labels', async () => (await label('w_sep')) === 'Separation');
  assert.equal(await label('max_speed_mps'), 'Max speed (m/s)');
  assert.match(await page.locator('#param-w_sep').locator('xpath=..').getAttribute('title'), /nearest neighbours/);
  // Groups, the failure injection collapsed.
  const groups = await page.locator('#params details:not([hidden]) summary').allInnerTexts();
  assert.deepEqual(groups, ['Flocking', 'Perception', 'Motion', 'Drone dynamics', 'World', 'Failures']);
  assert.ok(await page.locator('#group-failures #param-dropout').count() === 1);
  assert.ok(!(await page.locator('#param-dropout').isVisible()), 'failures start collapsed');
  assert.ok(await page.locator('#param-fov_deg').isVisible());
  // Every slider starts at the middle: the defaults are there.
  const pos = (name) => page.evaluate((n) => Number(document.getElementById(`param-${n}`).value), name);
  for (const name of ['w_sep', 'fov_deg', 'k_nearest', 'max_speed_mps']) {
    assert.equal(await pos(name), 500, `${name} at the middle`);
  }
  // The menu shows the active preset: the defaults, then a chosen one.
  const active = () => page.locator('#preset').inputValue();
  await until('the defaults shown as active', async () => (await active()) === 'defaults');
  await page.selectOption('#preset', 'fish-ball');
  await until('the preset applied', async () => (await rest(server, '/params')).k_nearest === 20);
  await until('fish-ball shown as active', async () => (await active()) === 'fish-ball');
  await shot(page, 'labels-and-preset');
  // A slider moved: custom. Restore defaults brings every value back.
  await page.evaluate(() => {
    const s = document.getElementById('param-w_ali');
    s.value = '800';
    s.dispatchEvent(new Event('change', { bubbles: true }));
  });
  await until('custom', async () => (await active()) === '');
  assert.equal(await page.locator('#preset option:checked').innerText(), 'custom');
  await page.click('#defaults');
  await until('the defaults restored', async () => (await active()) === 'defaults');
  const params = await rest(server, '/params');
  assert.equal(params.w_ali, 2);
  assert.equal(params.k_nearest, 7);
  assert.equal(await pos('w_ali'), 500);
  await page.close();
});

test('the model menu shows only the chosen model\'s parameters, and a drone preset picks its model', async () => {
  const server = await startServer();
  const page = await openViewer(server);
  const shown = () => page.locator('#params details:not([hidden]) summary').allInnerTexts();
  await until('the Reynolds groups', async () => (await shown()).join() === 'Flocking,Perception,Motion,Drone dynamics,World,Failures');
  assert.ok(await page.locator('#param-w_sep').isVisible());
  // Vásárhelyi: its terms and the drone-swarm ones appear, boids' weights go.
  await page.selectOption('#param-model', 'vasarhelyi');
  await until('the model applied', async () => (await rest(server, '/params')).model === 'vasarhelyi');
  await until('its groups', async () => (await shown()).join() === 'Flocking,Drone swarm,Vásárhelyi,Perception,Motion,Drone dynamics,World,Failures');
  assert.ok(!(await page.locator('#param-w_sep').isVisible()), 'separation is a Reynolds weight');
  assert.ok(await page.locator('#param-vas_rep_gain').isVisible());
  assert.ok(await page.locator('#param-k_nearest').isVisible(), 'every model hears k neighbours');
  // The Olfati-Saber preset: SwarmLab's set, its model, its menu entry.
  await page.selectOption('#preset', 'olfati-saber');
  await until('the preset applied', async () => {
    const p = await rest(server, '/params');
    return p.model === 'olfati_saber' && p.k_nearest === 10 && p.max_speed_mps === 7;
  });
  await until('olfati-saber shown', async () => (await page.locator('#preset').inputValue()) === 'olfati-saber');
  await until('its groups', async () => (await shown()).includes('Olfati-Saber') && !(await shown()).includes('Vásárhelyi'));
  // The flock flies under it.
  const t0 = (await rest(server, '/state')).tick;
  await until('ticks under the model', async () => (await rest(server, '/state')).tick > t0 + 30);
  await shot(page, 'model-olfati-saber');
  await page.close();
});

test('a preset chosen in the menu looks like its name: fish-ball is a few milling balls without overlaps', async () => {
  // The default flock a newcomer sees (5000 boids), started over with the
  // preset: after ten seconds the server's swarm metrics say what it looks
  // like (the engine's own check is crates/sim/tests/presets.rs).
  const server = await startServer(['--population', '5000']);
  const page = await openViewer(server);
  await until('the presets', async () => (await page.locator('#preset option').count()) > 2);
  await page.selectOption('#preset', 'fish-ball');
  await until('fish-ball active', async () => (await page.locator('#preset').inputValue()) === 'fish-ball');
  await page.click('#reset');
  const start = await until('the reset', async () => {
    const t = (await rest(server, '/state')).tick;
    return t < 120 ? t : null;
  });
  const m = await until('ten seconds of fish-ball', async () => {
    const { swarm } = await rest(server, '/metrics');
    return swarm.tick >= start + 600 ? swarm : null;
  }, 60_000);
  // A few balls hold every boid (a lone boid counts as a cluster), milling
  // (no common heading, neighbours crossing), none overlapping.
  assert.ok(m.clusters <= 12, `${m.clusters} clusters`);
  assert.ok(m.order < 0.4, `order ${m.order}`);
  assert.ok(typeof m.velocity_correlation === 'number' && m.velocity_correlation < 0.7,
    `velocity correlation ${m.velocity_correlation}`);
  assert.ok(m.collision_ratio < 0.01, `collision ratio ${m.collision_ratio}`);
  await shot(page, 'preset-fish-ball');
  await page.close();
});

test('predator mode: holding the mouse makes a pointer predator the boids flee', async () => {
  const server = await startServer(['--population', '500']);
  const page = await openViewer(server);
  // The middle of what the panel leaves free shows the world centre
  // (80, 80, 40), where the flock's centre is too (a click lands at its
  // depth): put a tight ball of boids there, then hold the predator on it.
  await post(server, '/boids/spawn', { center: [80, 80, 40], count: 400, spread_m: 4 });
  await page.click('[data-mode=predator]');
  const cx = await page.evaluate(() => (window.innerWidth - document.getElementById('panel').clientWidth - 16) / 2);
  await page.mouse.move(cx, 400);
  await page.mouse.down();
  await page.mouse.move(cx + 1, 400);
  const [predator] = await until('a pointer predator', async () => {
    const list = await rest(server, '/predators');
    return list.length === 1 && list[0].mode === 'pointer' ? list : null;
  });
  const p = predator.position;
  assert.ok(Math.hypot(p[0] - 80, p[1] - 80, p[2] - 40) < 6, `predator at ${p}, expected near the centre`);
  // Exports are limited (6 a minute per token, in bursts of 3): a look
  // refused for that waits for the next one rather than failing (on a
  // loaded machine the flee can take every look).
  const exportCsv = async () => {
    for (let i = 0; ; i++) {
      const res = await fetch(server.url + '/api/v1/trajectories.csv?seconds=1');
      const body = await res.text();
      if (res.status !== 429 || i === 3) {
        assert.ok(res.ok, `GET /trajectories.csv?seconds=1: ${res.status} ${body}`);
        return body;
      }
      await new Promise((r) => setTimeout(r, 10_000));
    }
  };
  const near = async () => {
    const csv = await exportCsv();
    const rows = csv.trim().split('\n').slice(1).map((l) => l.split(',').map(Number));
    const last = Math.max(...rows.map((r) => r[0]));
    return rows.filter((r) => r[0] === last && Math.hypot(r[3] - p[0], r[4] - p[1], r[5] - p[2]) < 10).length;
  };
  const start = await near();
  await shot(page, 'predator');
  // Boids flee at panic speed (about 20 m/s): within 2 s the ball is gone.
  // Look every 2 s, 4 times.
  let now = start;
  for (let i = 0; i < 4 && now >= start / 4; i++) {
    await new Promise((r) => setTimeout(r, 2000));
    now = await near();
  }
  assert.ok(now < start / 4, `${now} of ${start} boids still near the predator after the flee`);
  await page.mouse.up();
  await until('the predator removed on release', async () => (await rest(server, '/predators')).length === 0);
  await page.close();
});

test('clicks in goal, obstacle and add-boids modes create them', async () => {
  const server = await startServer();
  const page = await openViewer(server);
  await page.click('[data-mode=goal]');
  // Hovering shows where the click will land (a marker, a crosshair), and
  // the goal goes there. The flock moves between the two, so its centre's
  // depth may too: within a few metres.
  await page.mouse.move(560, 420);
  const marker = (await until('the cursor marker', async () => page.locator('body').getAttribute('data-cursor')))
    .split(' ').map(Number);
  assert.equal(await page.evaluate(() => document.getElementById('view').style.cursor), 'crosshair');
  await shot(page, 'cursor-marker');
  await page.mouse.click(560, 420);
  const [goal1] = await until('a goal', async () => {
    const goals = await rest(server, '/goals');
    return goals.length === 1 ? goals : null;
  });
  const at = goal1.kind.position;
  const off = Math.hypot(...at.map((v, i) => v - marker[i]));
  assert.ok(off < 8, `the goal at ${at}, the marker at ${marker}`);
  await page.click('[data-mode=obstacle]');
  await page.mouse.click(700, 380);
  await until('an obstacle', async () => (await rest(server, '/obstacles')).length === 1);
  await page.click('[data-mode=boids]');
  await page.mouse.click(640, 400);
  await until('50 more boids', async () => (await rest(server, '/state')).population === 2050);
  // Off the world box: refused on the page, nothing sent.
  await page.click('[data-mode=goal]');
  // No marker off the box: the pointer says a click won't land.
  await page.mouse.move(20, 780);
  await until('no marker off the box', async () => (await page.locator('body').getAttribute('data-cursor')) === null);
  assert.equal(await page.evaluate(() => document.getElementById('view').style.cursor), 'not-allowed');
  await page.mouse.click(20, 780);
  await until('the message', async () => /inside the world box/.test(await page.locator('#message').innerText()));
  assert.equal((await rest(server, '/goals')).length, 1);
  // The agent list: each with a remove button that undoes it.
  await until('the list', async () => /goal \d+/.test(await page.locator('#agents').innerText())
    && /obstacle \d+/.test(await page.locator('#agents').innerText()));
  await shot(page, 'agents');
  const goal = (await rest(server, '/goals'))[0].id;
  await page.click(`[data-remove="${goal}"]`);
  await until('the goal removed', async () => (await rest(server, '/goals')).length === 0);
  await until('the list without it', async () => !/goal/.test(await page.locator('#agents').innerText()));
  assert.equal((await rest(server, '/obstacles')).length, 1, 'the obstacle stays');
  // The population control sets the count either way.
  for (const n of [1500, 1800]) {
    await page.fill('#population', String(n));
    await page.click('#population-set');
    await until(`${n} boids`, async () => (await rest(server, '/state')).population === n);
  }
  await page.close();
});

test('pause stops the tick, step advances it, space resumes', async () => {
  const server = await startServer();
  const page = await openViewer(server);
  await page.click('#pause');
  const paused = await until('paused', async () => {
    const s = await rest(server, '/state');
    return s.paused ? s : null;
  });
  await until('the button to say Resume', async () => (await page.locator('#pause').innerText()) === 'Resume');
  const t0 = (await rest(server, '/state')).tick;
  await new Promise((r) => setTimeout(r, 1000));
  assert.equal((await rest(server, '/state')).tick, t0, 'no ticks while paused');
  assert.ok(t0 >= paused.tick);
  await page.click('#step');
  await until('one step', async () => (await rest(server, '/state')).tick === t0 + 1);
  await until('the page shows it', async () => (await number(page, '#st-tick')) === t0 + 1);
  await page.keyboard.press('Space');
  await until('running again', async () => {
    const s = await rest(server, '/state');
    return !s.paused && s.tick > t0 + 5;
  });
  // After a slider is used, the focus stays on it and the shortcuts still work.
  const slider = page.locator('#param-w_sep');
  await slider.focus();
  await slider.press('ArrowRight');
  await page.keyboard.press('t');
  await until('trails on', async () => (await page.locator('#trails').getAttribute('class')) === 'on');
  // Space toggles what the page shows: wait until it shows the flock running.
  await until('the page to show it running', async () => (await page.locator('#pause').innerText()) === 'Pause');
  await page.keyboard.press('Space');
  await until('paused from the slider', async () => (await rest(server, '/state')).paused);
  await until('the page to show it paused', async () => (await page.locator('#pause').innerText()) === 'Resume');
  await page.keyboard.press('Space');
  await until('running again from the slider', async () => !(await rest(server, '/state')).paused);
  await page.close();
});

test('with a viewer token the controls are disabled and say which role they need', async () => {
  const server = await startServer(['--operator-token', 'operator-secret', '--viewer-token', 'viewer-secret']);
  const page = await openViewer(server, '?token=viewer-secret');
  await until('the role', async () => (await page.locator('#st-role').innerText()) === 'viewer');
  for (const sel of ['#pause', '#step', '#reset', '#preset', '#param-w_sep', '[data-mode=predator]', '[data-mode=goal]']) {
    assert.ok(await page.locator(sel).isDisabled(), `${sel} is disabled`);
  }
  assert.match(await page.locator('#pause').getAttribute('title'), /needs the operator role; you are viewer/);
  assert.match(await page.locator('[data-mode=predator]').getAttribute('title'), /needs the pilot role/);
  // The keyboard shortcut is refused on the page too, and nothing changes.
  await page.keyboard.press('Space');
  await until('the refusal', async () => /needs the operator role/.test(await page.locator('#message').innerText()));
  const s = await rest(server, '/state', { headers: { authorization: 'Bearer operator-secret' } });
  assert.equal(s.paused, false);
  // A banner says the page is read-only, once.
  assert.ok(await page.locator('#banner').isVisible(), 'the read-only banner');
  assert.match(await page.locator('#banner').innerText(), /read-only.*pilot or operator token/);
  // Anyone may zoom and then frame the whole world again.
  const distance = async () => Number(await page.locator('body').getAttribute('data-view-distance'));
  await until('the camera', async () => (await distance()) > 0);
  const d0 = await distance();
  await page.mouse.move(400, 400);
  await page.mouse.wheel(0, -600);
  await until('zoomed in', async () => (await distance()) < d0 * 0.9);
  await page.click('#home');
  await until('the whole world framed again', async () => Math.abs((await distance()) - d0) < 0.01);
  await shot(page, 'viewer-role');
  // The operator token enables them.
  const op = await openViewer(server, '?token=operator-secret');
  await until('the role', async () => (await op.locator('#st-role').innerText()) === 'operator');
  assert.ok(await op.locator('#pause').isEnabled());
  assert.ok(await op.locator('#banner').isHidden(), 'no banner for an operator');
  await page.close();
  await op.close();
});

test('two pages at once see the same tick sequence', async () => {
  const server = await startServer();
  const [a, b] = [await openViewer(server), await openViewer(server)];
  await new Promise((r) => setTimeout(r, 3000));
  const ticks = async (p) => (await p.evaluate(() => document.body.dataset.ticks)).split(' ').map(Number);
  const [ta, tb] = [await ticks(a), await ticks(b)];
  for (const t of [ta, tb]) {
    assert.ok(t.length >= 20, `${t.length} frames logged`);
    assert.ok(t.every((v, i) => i === 0 || v > t[i - 1]), 'ticks only go forward');
  }
  // Within the span both logs cover, both pages got the same broadcasts.
  const lo = Math.max(ta[0], tb[0]);
  const hi = Math.min(ta[ta.length - 1], tb[tb.length - 1]);
  // A page that slows its stream (its pace) gets fewer of the same
  // broadcasts, so the sparser log is checked against the denser one.
  const [sparse, dense] = [ta, tb]
    .map((t) => t.filter((v) => v >= lo && v <= hi))
    .sort((x, y) => x.length - y.length);
  assert.ok(sparse.length >= 10, `overlap of ${sparse.length} frames`);
  const inDense = new Set(dense);
  const common = sparse.filter((t) => inDense.has(t)).length;
  const asked = async (p) => p.evaluate(() => document.body.dataset.askedFps ?? 'full rate');
  assert.ok(
    common >= sparse.length * 0.9,
    `${common} of ${sparse.length} ticks in common (pages asked for ${await asked(a)} and ${await asked(b)} frames/s)`,
  );
  // Paused, both show exactly the server's tick.
  await post(server, '/control/pause');
  const { tick } = await rest(server, '/state');
  for (const p of [a, b]) {
    await until('the paused tick on the page', async () => (await number(p, '#st-tick')) === tick);
  }
  await a.close();
  await b.close();
});

test('a pilot sees the server refuse what goes over its cap', async () => {
  const server = await startServer(['--operator-token', 'operator-secret', '--pilot-token', 'pilot-secret']);
  const page = await openViewer(server, '?token=pilot-secret');
  await until('the role', async () => (await page.locator('#st-role').innerText()) === 'pilot');
  assert.ok(await page.locator('#param-w_sep').isDisabled(), 'a pilot may not change parameters');
  assert.ok(await page.locator('[data-mode=goal]').isEnabled(), 'a pilot may place goals');
  await page.click('[data-mode=goal]');
  // A pilot may hold 8 agents; the ninth is refused by the server.
  for (let k = 0; k < 9; k++) {
    await page.mouse.click(520 + 20 * k, 420);
    await until(`answer ${k + 1}`, async () => /done|refused/.test(await page.locator('#message').innerText()));
    if (k < 8) {
      await until(`goal ${k + 1}`, async () => (await rest(server, '/goals')).length === k + 1);
      await page.evaluate(() => { document.getElementById('message').textContent = ''; });
    }
  }
  await until('the refusal on the page', async () => /goal: refused/.test(await page.locator('#message').innerText()));
  assert.equal(await page.locator('#message').getAttribute('class'), 'error');
  assert.equal((await rest(server, '/goals')).length, 8);
  await shot(page, 'pilot-refused');
  await page.close();
});

test('the viewer reconnects after a restart and the checkpoint resumes the flock', async () => {
  const dir = (await import('node:fs')).mkdtempSync(join((await import('node:os')).tmpdir(), 'starling-'));
  const state = join(dir, 'flock.json');
  const first = await startServer(['--state-file', state]);
  const port = new URL(first.url).port;
  const page = await openViewer(first);
  await until('some ticks', async () => (await number(page, '#st-tick')) > 60);
  await first.stop();
  const { tick: lastTick } = JSON.parse((await import('node:fs')).readFileSync(state, 'utf8'));
  assert.ok(lastTick > 60, `checkpoint at tick ${lastTick}`);
  await until('the page to notice', async () => /reconnecting|connecting/.test(await page.locator('#st-conn').innerText()));
  // In words, not close codes; the controls wait for the connection.
  assert.doesNotMatch(await page.locator('#st-conn').innerText(), /code|\d{4}/);
  assert.ok(await page.locator('#pause').isDisabled(), 'pause is disabled while disconnected');
  assert.match(await page.locator('#pause').getAttribute('title'), /not connected/);
  // A command tried meanwhile is refused on the page.
  await page.keyboard.press('Space');
  await until('the refusal', async () => /not connected|needs/.test(await page.locator('#message').innerText()));
  await shot(page, 'disconnected');
  const second = await startServer(['--state-file', state, '--bind', `127.0.0.1:${port}`]);
  assert.equal(second.url, first.url);
  await until('live again', async () => /live/.test(await page.locator('#st-conn').innerText()));
  await until('frames again', async () => (await number(page, '#st-tick')) > lastTick);
  // Reconnected: the controls are back and the stale error is gone.
  assert.ok(!(await page.locator('#pause').isDisabled()), 'pause is enabled again');
  assert.equal(await page.locator('#message').innerText(), '');
  await page.close();
});

test('a served replay shows a seek bar that moves the recording', async () => {
  const dir = (await import('node:fs')).mkdtempSync(join((await import('node:os')).tmpdir(), 'starling-'));
  const file = join(dir, 'session.jsonl');
  const live = await startServer(['--record', file]);
  await post(live, '/boids/kill', { count: 500 });
  await until('some ticks', async () => (await rest(live, '/state')).tick > 150);
  await live.stop();
  const server = await startServer([], ['replay', file, '--serve']);
  const { replay } = await rest(server, '/state');
  assert.ok(replay && replay.end_tick > 150, JSON.stringify(replay));
  const page = await openViewer(server);
  await until('the seek bar', async () => page.locator('#replay').isVisible());
  await post(server, '/control/pause');
  await page.evaluate(() => {
    const s = document.getElementById('seek');
    s.value = '40';
    s.dispatchEvent(new Event('input', { bubbles: true }));
    s.dispatchEvent(new Event('change', { bubbles: true }));
  });
  await until('the replay at tick 40', async () => (await rest(server, '/state')).tick === 40);
  await until('the page at tick 40', async () => (await number(page, '#st-tick')) === 40);
  // Live-only controls are refused with the server's reason.
  await page.click('[data-mode=goal]');
  await page.mouse.click(560, 420);
  await until('the refusal', async () => /replays a recording/.test(await page.locator('#message').innerText()));
  await shot(page, 'replay');
  await page.close();
});

test('on a 2 Mbit/s link the interest stream keeps the page live within its budget', async () => {
  // 100k boids at the default density (the default world holds 5000).
  const config = join(mkdtempSync(join(tmpdir(), 'starling-')), 'big.toml');
  writeFileSync(config, '[params]\nworld_m = [434.0, 434.0, 217.0]\n');
  const server = await startServer(['--config', config, '--population', '100000']);
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  // The page's link: 2 Mbit/s each way, 40 ms of latency.
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Network.enable');
  await cdp.send('Network.emulateNetworkConditions', {
    offline: false, latency: 40, downloadThroughput: 250_000, uploadThroughput: 250_000,
  });
  const budget = 250_000;
  await page.goto(`${server.url}/?budget=${budget}`);
  const cells = async () => (await page.locator('body').getAttribute('data-cells') ?? '0 0').split(' ').map(Number);
  await until('cells held in full and summaries', async () => {
    const [held, blobs] = await cells();
    return held > 0 && blobs > 0;
  });
  assert.deepEqual(errors, [], 'no script errors');
  // Over ten seconds the page keeps up: its tick rises and stays close to
  // the server's (no growing backlog), within its budget. It starts slow
  // ("(starting)" on the status line: 64 kB/s, a quarter more each second
  // while its probe shows no queue). The emulated link carries less than
  // its nominal 250 kB/s, so the page then lowers its budget to what it
  // carries instead of queueing ("(link)").
  const lags = [];
  const statuses = [];
  let last = 0;
  for (let i = 0; i < 5; i++) {
    await new Promise((r) => setTimeout(r, 2000));
    const shown = await number(page, '#st-tick');
    const live = (await rest(server, '/state')).tick;
    assert.ok(shown > last, `the page's tick went from ${last} to ${shown}`);
    last = shown;
    lags.push(live - shown);
    statuses.push(await page.locator('#st-kbps').innerText());
    const kbps = Number(await page.locator('body').getAttribute('data-kbps'));
    assert.ok(kbps <= budget / 1000, `${kbps} kB/s over a budget of ${budget / 1000}`);
  }
  // At 60 ticks a second, two seconds behind at most, and not growing.
  assert.ok(Math.max(...lags) < 120, `lag in ticks: ${lags}`);
  assert.ok(lags[4] <= lags[0] + 60, `the lag grows: ${lags}`);
  assert.ok(statuses.some((s) => s.endsWith(' (starting)')), `status lines: ${statuses}`);
  // Chromium's emulated 250 kB/s carries about 150 kB/s of WebSocket
  // frames here: once started, the page lowers its budget to it (on the
  // debug server the stream fills the link some 10-40 s in).
  await until('the budget lowered to what the link carries', async () =>
    (await page.locator('#st-kbps').innerText()).endsWith(' (link)'), 90_000);
  const status = await page.locator('#st-kbps').innerText();
  // The budget the status line shows ("kB/s / budget", then why).
  const budgetIn = (line) => Number(line.match(/ \/ (\d+)( \((link|starting)\))?$/)?.[1]);
  const streamed = budgetIn(status);
  assert.ok(streamed >= 32 && streamed <= budget / 1000, `the stream's budget in "${status}"`);
  // On its lowered budget the page still keeps up, within that budget
  // (the 10 % over). The kB/s shown is a 2 s average, and a cut
  // takes a second or two to drain the link's queue, so each reading is
  // held to the largest budget the page announced over the 4.5 s before,
  // and one reading of three may be over (a page slowed by a loaded
  // machine); a stream that ignored the lowered budget would fill the
  // link, about 1.2 times it, at every reading.
  const budgets = []; // [ms, the budget the status line shows, kB/s]
  const sampleFor = async (ms) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      const line = await page.locator('#st-kbps').innerText();
      const b = budgetIn(line);
      if (b > 0) budgets.push([Date.now(), b]);
      await new Promise((r) => setTimeout(r, 250));
    }
  };
  await sampleFor(4000);
  const after = [];
  const readings = [];
  for (let i = 0; i < 3; i++) {
    await sampleFor(2000);
    const shown = await number(page, '#st-tick');
    const live = (await rest(server, '/state')).tick;
    assert.ok(shown > last, `on its lowered budget the page's tick went from ${last} to ${shown}`);
    last = shown;
    after.push(live - shown);
    const kbps = Number(await page.locator('body').getAttribute('data-kbps'));
    const recent = Math.max(...budgets.filter(([t]) => t >= Date.now() - 4500).map(([, b]) => b));
    readings.push([kbps, recent]);
  }
  const over = readings.filter(([kbps, recent]) => kbps > recent * 1.1);
  assert.ok(over.length <= 1, `kB/s against the budget of the last 4.5 s: ${JSON.stringify(readings)}`);
  assert.ok(Math.max(...after) < 120, `lag in ticks on the lowered budget: ${after}`);
  assert.equal(await page.locator('#stream').inputValue(), String(budget));
  await shot(page, 'interest-2mbit');
  await page.close();
  // The bandwidth control switches a whole-world page to the interest stream.
  const plain = await openViewer(server);
  assert.equal(await plain.locator('body').getAttribute('data-cells'), null);
  await plain.selectOption('#stream', '62500');
  await until('the interest stream after choosing it', async () => {
    const [held] = (await plain.locator('body').getAttribute('data-cells') ?? '0 0').split(' ').map(Number);
    return held > 0 && / \/ 6[23]$/.test(await plain.locator('#st-kbps').innerText());
  });
  await plain.close();
  // A budget under the protocol's floor is raised to it, not refused.
  const low = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await low.goto(`${server.url}/?budget=1000`);
  await until('the interest stream at the floor', async () => {
    const [held] = (await low.locator('body').getAttribute('data-cells') ?? '0 0').split(' ').map(Number);
    return held > 0 && / \/ 32$/.test(await low.locator('#st-kbps').innerText());
  });
  await low.close();
});

/** A nats-server on a free loopback port (Debian's; cargo xtask test installs it). */
async function startNats() {
  const { existsSync } = await import('node:fs');
  const bin = process.env.STARLING_NATS_SERVER
    ?? ['/usr/sbin/nats-server', '/usr/bin/nats-server'].find((p) => existsSync(p));
  assert.ok(bin, 'nats-server is installed (apt-get install nats-server)');
  const net = await import('node:net');
  const port = await new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const proc = spawn(bin, ['-a', '127.0.0.1', '-p', String(port)], { stdio: 'ignore' });
  const server = { url: `nats://127.0.0.1:${port}`, async stop() { proc.kill('SIGKILL'); } };
  servers.push(server);
  await until('nats-server to listen', () => new Promise((resolve) => {
    const c = net.connect(port, '127.0.0.1', () => { c.end(); resolve(true); });
    c.on('error', () => resolve(false));
  }));
  return server;
}

test('a page given two edges moves to the other when its edge stops', async () => {
  const nats = await startNats();
  await startServer(['--nats', nats.url]);
  const a = await startServer(['--nats', nats.url], ['edge']);
  // The page is served by edge a; edge b takes its WebSocket too.
  const b = await startServer(['--nats', nats.url, '--allow-origin', a.url], ['edge']);
  for (const e of [a, b]) {
    await until('the edge to follow the origin', async () => (await fetch(e.url + '/readyz')).status === 200);
  }
  const hosts = [a, b].map((e) => new URL(e.url).host).join(',');
  const page = await openViewer(a, `?endpoints=${hosts}`);
  const viewersOf = async (e) => (await rest(e, '/state')).viewers;
  const [on, other] = await until('the page on one edge', async () => {
    const [va, vb] = [await viewersOf(a), await viewersOf(b)];
    return va === 1 ? [a, b] : vb === 1 ? [b, a] : null;
  });
  const tick = await number(page, '#st-tick');
  await on.stop();
  await until('the page on the other edge', async () => (await viewersOf(other)) === 1);
  await until('frames again', async () => (await number(page, '#st-tick')) > tick + 30);
  await until('live again', async () => /live/.test(await page.locator('#st-conn').innerText()));
  await shot(page, 'edge-failover');
  await page.close();
});

test('a page the whole-world stream has no room for reopens itself on the interest stream', async () => {
  // 8,000 boids: keyframes of 64 kB, and the whole-world stream's sockets
  // may hold 100 kB, so one whole-world page fits and a second not.
  const server = await startServer(['--population', '8000', '--whole-world-bytes', '100000']);
  const first = await openViewer(server);
  const second = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const errors = [];
  second.on('pageerror', (e) => errors.push(e.message));
  await second.goto(server.url + '/?view=1');
  await until('the second page on the interest stream', async () => new URL(second.url()).searchParams.get('budget') === 'auto');
  assert.equal(new URL(second.url()).searchParams.get('view'), '1', 'its other parameters kept');
  await until('frames on the reopened page', async () => Number(await second.locator('#st-frames').innerText()) >= 3);
  assert.deepEqual(errors, [], 'no script errors');
  assert.ok(Number(await first.locator('#st-frames').innerText()) >= 3, 'the first page still whole-world');
  assert.equal(new URL(first.url()).searchParams.get('budget'), null);
  await shot(second, 'whole-world-full-reopened');
  await first.close();
  await second.close();
});

test('a token the server does not know is named in the banner', async () => {
  const server = await startServer(['--operator-token', 'the-real-operator-token']);
  const page = await openViewer(server, '?token=a-typo-in-the-token');
  await until('the banner', async () => /not recognised/.test(await page.locator('#banner').innerText()));
  assert.ok(await page.locator('#pause').isDisabled(), 'the controls are read-only');
  await shot(page, 'token-not-recognised');
  await page.close();
});

test('a CPU-throttled page asks for fewer frames and catches up', async () => {
  // 8000 boids and a page made 12x slower than this machine: it cannot take
  // 30 snapshots a second (a heavier flock makes the debug server and the
  // browser share two cores, and nothing the page does can help). A faster
  // machine keeps up at 12x, so the throttle rises until the page has to
  // slow the stream: what is tested is that it then does, not how fast the
  // machine is. The steps are small: one CI run went from keeping up at
  // 20x to a page too slow even for the slowest stream (2 a second) at 32x.
  const server = await startServer(['--population', '8000']);
  const page = await openViewer(server);
  const cdp = await page.context().newCDPSession(page);
  const asked = async () => Number(await page.evaluate(() => document.body.dataset.askedFps ?? 0));
  let rate = 0;
  for (rate of [12, 16, 20, 24, 28, 32]) {
    await cdp.send('Emulation.setCPUThrottlingRate', { rate });
    try {
      await until(`the page to slow the stream at ${rate}x`, async () => (await asked()) > 0, 20_000);
      break;
    } catch (e) {
      if (rate === 32) throw e;
    }
  }
  assert.ok((await asked()) < 30);
  // It drops what queued up and comes back within a second of the server
  // (60 ticks a second).
  const lag = async () => (await rest(server, '/state')).tick - (await number(page, '#st-tick'));
  const t0 = Date.now();
  await until('the page to catch up', async () => (await lag()) <= 60, 60_000);
  // Then it stays within about a second: the median of eight looks in a
  // row, one a second, is at most 60 ticks behind (measured here: 8 to 28;
  // a single look may catch a pause of the shared cores, so the median).
  // Within 24 looks: one CI run fell back for four seconds just after
  // catching up (109, 88, 131, 127) and then kept up (11, 17, 2, 17).
  const behind = [];
  const median = () => [...behind.slice(-8)].sort((x, y) => x - y)[4];
  for (let k = 0; k < 24 && !(behind.length >= 8 && median() <= 60); k++) {
    await new Promise((r) => setTimeout(r, 1000));
    behind.push(await lag());
  }
  console.log(`throttled ${rate}x: caught up in ${Date.now() - t0 - 1000 * behind.length} ms, asks ${await asked()}/s, ticks behind ${behind.join(' ')}`);
  assert.ok(behind.length >= 8 && median() <= 60, `ticks behind: ${behind}`);
  await shot(page, 'cpu-throttled');
  await cdp.send('Emulation.setCPUThrottlingRate', { rate: 1 });
  await page.close();
});

test('a headless run writes a report whose plots open in the browser', async () => {
  const { mkdtempSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const out = join(mkdtempSync(join(tmpdir(), 'starling-report-')), 'run');
  const scenario = join(import.meta.dirname, '../../scenarios/failure-drill.toml');
  // Two seeds, 25 simulated seconds: the first event (at 20 s) is marked.
  const code = await new Promise((resolve) => {
    const proc = spawn(BIN, ['run', scenario, '--seeds', '1..2', '--until-seconds', '25', '--out', out], { stdio: 'ignore' });
    proc.on('exit', resolve);
  });
  assert.equal(code, 0, 'starling run succeeded');
  const page = await browser.newPage({ viewport: { width: 820, height: 1300 } });
  await page.goto(`file://${out}/report.html`);
  assert.match(await page.locator('h1').innerText(), /failure-drill — 2 seed/);
  const figures = page.locator('figure');
  assert.deepEqual(
    await figures.evaluateAll((fs) => fs.map((f) => f.dataset.metric)),
    ['order', 'largest_cluster', 'collisions', 'min_nn_m'],
  );
  for (const f of await figures.all()) {
    assert.equal(await f.locator('svg').count(), 1);
    assert.ok(Number(await f.getAttribute('data-points')) > 100, 'a point every 10 ticks for 25 s');
    assert.match(await f.innerText(), /mean of 2 seeds/);
    assert.match(await f.innerText(), /kill_boids/, 'the event is marked');
  }
  // Drawn, not blank: the order plot's line is there.
  const box = await figures.first().locator('svg').boundingBox();
  assert.ok(box.width > 700 && box.height > 200, `plot of ${box.width}x${box.height}`);
  assert.match(await page.locator('#figures').innerText(), /final order/);
  await shot(page, 'run-report');
  await page.close();
});
