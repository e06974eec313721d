// The demo page: a project of video generations, watched live with the
// pushd client. Query parameters choose who and what:
//   tenant, user            whom to ask a demo token for, on a node that
//                           hands them out (default demo, demo-user)
//   project                 (default launch-campaign)
//   transport               sse or ws (default sse)
//   #token=...              a token, for a node that serves no demo tokens
// and tune the client for tests and experiments (milliseconds):
//   hello_ms, fallback_after, poll_ms, stream_retry_ms, backoff_ms
// Whatever the URL says, the header shows whom the token in use names.
// The tabs of one browser that show the same tenant, user and project
// share one connection (the client's share option): one holds it, the
// others receive through it, and the connection panel says which this is.
import { PushdClient, isTerminal, limitOf } from '/client/pushd.js';

const params = new URLSearchParams(location.search);
const tenant = params.get('tenant') || 'demo';
const user = params.get('user') || 'demo-user';
const project = params.get('project') || 'launch-campaign';
const num = (name) => (params.has(name) ? Number(params.get(name)) : undefined);

const $ = (id) => document.getElementById(id);

const STATUS = {
  QUEUED: 'Queued',
  RUNNING: 'Running',
  PROVIDER_SUBMITTED: 'Generating',
  POST_PROCESSING: 'Finishing',
  SUCCEEDED: 'Ready',
  FAILED: 'Failed',
  CANCELED: 'Canceled',
};
const STAGE = {
  queued: 'Waiting for a GPU slot',
  preparing_inputs: 'Preparing inputs',
  prompt_enhancement: 'Enhancing the prompt',
  provider_generating: 'Generating with the provider',
  upscaling: 'Upscaling',
  transcoding: 'Transcoding',
  done: 'Done',
};
const KIND = { text_to_video: 'Text → Video', image_to_video: 'Image → Video' };
// What the product says for the error codes its pipeline sets; a snapshot
// read back from PostgreSQL carries the code only.
const ERROR = { provider_content_rejected: 'The provider rejected the generation request.' };
const REASON = {
  pubsub_down: 'the node lost its bus',
  sources_unavailable: 'neither Redis nor PostgreSQL answers',
  restored: 'the bus is back',
};
const STATE = { idle: 'Idle', connecting: 'Connecting', streaming: 'Streaming', polling: 'Polling', closed: 'Closed' };
const TRANSPORT = { sse: 'Server-Sent Events', ws: 'WebSocket' };
const LIMITED = { connect: 'connecting', poll: 'polling', subscribe: 'subscribing', request: 'a WebSocket request' };

// --- tokens ----------------------------------------------------------------

// What the node serves the page: {"tokens": true} when GET /demo/token hands
// out tokens (the embedded mode without a configured key). The page asks
// rather than guesses, so a node without them logs no 404 on every load.
let config = { tokens: false };
try {
  const res = await fetch('/demo/config', { cache: 'no-store' });
  if (res.ok) config = await res.json();
} catch {
  // The node is not reachable: the client reports that when it connects.
}

// A token can also come in the URL fragment (#token=...), which browsers
// never send to a server.
let pastedToken = new URLSearchParams(location.hash.slice(1)).get('token') || sessionStorage.getItem('pushd-demo-token') || '';
let currentToken = ''; // the token the node last accepted, for starting tasks

async function demoToken() {
  // The page watches one project: its token is granted that project.
  const res = await fetch(`/demo/token?tenant=${encodeURIComponent(tenant)}&user=${encodeURIComponent(user)}&projects=${encodeURIComponent(project)}`, { cache: 'no-store' });
  if (!res.ok) throw new Error(`token: HTTP ${res.status}`);
  return (await res.json()).token;
}

// getToken gives the client a token: a demo token from a node that hands
// them out, else the pasted one, else one the person pastes now. The node
// names the token's tenant and user for the header; a pasted token it
// refuses is asked for again rather than connected with.
async function getToken() {
  let refused = '';
  for (;;) {
    const token = config.tokens ? await demoToken() : pastedToken || await askToken(refused);
    const who = await whoIs(token);
    if (who.ok || config.tokens || !who.refused) {
      showIdentity(who);
      currentToken = token;
      return token;
    }
    refused = who.message;
    pastedToken = '';
    sessionStorage.removeItem('pushd-demo-token');
  }
}

// whoIs asks the node whom the token names. The answer is for display
// only: every request the page makes is authorized by the node anyway.
async function whoIs(token) {
  try {
    const res = await fetch('/demo/me', { headers: { Authorization: `Bearer ${token}` }, cache: 'no-store' });
    const body = await res.json().catch(() => ({}));
    if (res.ok) return { ok: true, tenant: body.tenant_id, user: body.user_id };
    return { refused: res.status === 401, message: body.message || `HTTP ${res.status}` };
  } catch {
    return {};
  }
}

function showIdentity(who) {
  const header = $('who');
  header.textContent = who.ok ? `${who.user} · tenant ${who.tenant}` : '';
  header.dataset.tenant = who.ok ? who.tenant : '';
  header.dataset.user = who.ok ? who.user : '';
}

function askToken(refused) {
  const dialog = $('token-dialog');
  const error = $('token-error');
  error.textContent = refused ? `The node refused that token: ${refused}.` : '';
  error.hidden = !refused;
  return new Promise((resolve) => {
    $('token-form').addEventListener('submit', () => {
      pastedToken = $('token-input').value.trim();
      sessionStorage.setItem('pushd-demo-token', pastedToken);
      resolve(pastedToken);
    }, { once: true });
    dialog.showModal();
  });
}

// The inputs of the tasks this page started. A snapshot carries the demo's
// kind and prompt while Redis holds it, but PostgreSQL, where a reload
// lists the project from, has no column for them; a real product page reads
// them from its own API. Kept for the last 50 tasks.
const STARTED_KEY = 'pushd-demo-started';
const started = (() => {
  try {
    return new Map(JSON.parse(localStorage.getItem(STARTED_KEY)) || []);
  } catch {
    return new Map();
  }
})();

function remember(t) {
  started.set(t.task_id, { kind: t.kind, prompt: t.prompt });
  while (started.size > 50) started.delete(started.keys().next().value);
  try {
    localStorage.setItem(STARTED_KEY, JSON.stringify([...started]));
  } catch {
    // Storage full or refused: the card shows what the snapshots carry.
  }
}

// --- the client --------------------------------------------------------------

const transport = params.get('transport') === 'ws' ? 'ws' : 'sse';
const client = new PushdClient({
  token: getToken,
  transport,
  projects: [project],
  helloTimeoutMs: num('hello_ms'),
  fallbackAfter: num('fallback_after'),
  pollIntervalMs: num('poll_ms'),
  streamRetryMs: num('stream_retry_ms'),
  backoffBaseMs: num('backoff_ms'),
  share: true,
});

let reconnects = 0;
let lastNode = '';
let announce = true; // log the next hello: the first, or one after a loss or a switch

client.addEventListener('state', (e) => renderConnection(e.detail));
let lastRole = null;
client.addEventListener('share', (e) => {
  const { role, tabs } = e.detail;
  renderShare(e.detail);
  if (role === lastRole) return;
  const first = lastRole === null;
  lastRole = role;
  // A tab alone leading its own connection is the usual case: no line.
  if (role === 'leader' && !(first && tabs === 1)) log(`This tab now holds the connection ${tabs === 1 ? 'alone' : `for ${tabs} tabs`}`, 'ok');
  else if (role === 'follower') log('Another tab holds the connection: this one receives through it');
});
client.addEventListener('hello', (e) => {
  const d = e.detail;
  // An SSE stream restarts when the page watches something new; only a
  // first connection, a recovery or a new node is worth a line.
  const worth = announce || d.resumed || d.node !== lastNode;
  announce = false;
  lastNode = d.node;
  if (!worth) return;
  log(`${d.resumed ? 'Back to streaming' : 'Streaming'} over ${TRANSPORT[d.transport]} from node ${d.node} (server mode: ${d.mode})`, 'ok');
});
client.addEventListener('mode', (e) => {
  const { mode, reason } = e.detail;
  log(mode === 'polling'
    ? `Server switched to polling${reason ? ` (${reason})` : ''}: updates may lag by a few seconds`
    : `Server back to push${reason ? ` (${reason})` : ''}`, mode === 'polling' ? 'warn' : 'ok');
});
client.addEventListener('reconnecting', (e) => {
  const { delayMs, reason, polling } = e.detail;
  reconnects++;
  announce = true;
  $('conn').dataset.reconnects = String(reconnects);
  $('f-reconnects').textContent = String(reconnects);
  log(polling
    ? `Stream unavailable (${reason}): polling over HTTP, trying to stream again ${inTime(delayMs)}`
    : `Connection lost (${reason}): reconnecting ${inTime(delayMs)}`, 'warn');
});
client.addEventListener('error', (e) => {
  const d = e.detail;
  if (d.code === 'not_found' && d.task_id) return; // a task not published yet arrives when it is
  if (limitOf(d)) return; // the limited event says it, once per wait
  log(`Server: ${d.code}${d.message ? ` (${d.message})` : ''}`, 'warn');
});
// A refusal for a limit, in the platform's words; the client asks again
// by itself once the wait is over.
client.addEventListener('limited', (e) => {
  const d = e.detail;
  $('conn').dataset.limited = d.message;
  log(`Server: ${d.message} (${LIMITED[d.source] || d.source})`, 'warn');
});
client.addEventListener('task', (e) => {
  const { task, previous } = e.detail;
  if (task.project_id && task.project_id !== project) return;
  logTask(task, previous);
  renderTask(task);
});

// --- rendering ---------------------------------------------------------------

function renderConnection(d) {
  const conn = $('conn');
  conn.dataset.state = d.state;
  conn.dataset.transport = d.transport;
  conn.dataset.serverMode = d.serverMode || '';
  $('f-transport').textContent = TRANSPORT[d.transport];
  $('f-state').textContent = STATE[d.state] || d.state;
  $('f-state').dataset.state = d.state;
  $('f-mode').textContent = d.serverMode ? (d.serverMode === 'push' ? 'Push' : 'Polling') : '—';
  $('f-mode').dataset.mode = d.serverMode || '';
  $('f-mode').title = d.serverReason ? REASON[d.serverReason] || d.serverReason : '';
  $('f-node').textContent = d.node || '—';
  $('f-node').title = d.node || '';
  $('use-sse').setAttribute('aria-pressed', String(d.transport === 'sse'));
  $('use-ws').setAttribute('aria-pressed', String(d.transport === 'ws'));
  const [state, text, title] = pill(d);
  const p = $('conn-pill');
  p.dataset.state = state;
  p.title = title;
  $('conn-pill-text').textContent = text;
}

// renderShare shows the tab's part in the shared connection: it holds the
// connection (leads), receives through another tab's (follows), or holds
// one of its own (a browser that cannot share).
function renderShare({ role, tabs }) {
  const conn = $('conn');
  conn.dataset.role = role || '';
  conn.dataset.tabs = String(tabs);
  const f = $('f-role');
  const n = `${tabs} tab${tabs === 1 ? '' : 's'}`;
  f.textContent = role === 'leader' ? `Leads · ${n}` : role === 'follower' ? `Follows · ${n}` : 'Own connection';
  f.title = role === 'leader'
    ? `This tab holds the connection${tabs > 1 ? `; ${tabs - 1} other tab${tabs > 2 ? 's' : ''} of this browser receive through it` : ''}`
    : role === 'follower'
      ? 'Another tab of this browser holds the connection; this one receives through it, and takes over if that tab closes or freezes'
      : 'This tab holds a connection of its own';
}

// pill is the header's summary of the connection: its state, text and
// tooltip. A stream from a server that polls is not live: changes come up
// to a poll interval late, and the pill says so, with the server's reason.
function pill(d) {
  const over = d.transport === 'ws' ? 'WebSocket' : 'SSE';
  if (d.state === 'streaming' && d.serverMode === 'polling') {
    const why = d.serverReason ? REASON[d.serverReason] || d.serverReason : 'the server polls its sources';
    return ['server-polling', `Polling${d.serverReason ? ` (${d.serverReason})` : ''}`, `Streaming over ${over}, but ${why}: updates may lag by a few seconds`];
  }
  if (d.state === 'streaming') return ['streaming', `Live · ${over}`, `Streaming over ${over} from node ${d.node}`];
  if (d.state === 'polling') return ['polling', 'Polling over HTTP', `No stream${d.reason ? ` (${d.reason})` : ''}: reading the tasks over HTTP`];
  return [d.state, STATE[d.state] || d.state, ''];
}

const cards = new Map(); // task_id -> card element

// webURL is url when it is, resolved against the page, an http or https
// URL, else null: a snapshot's output_url of javascript: or data: never
// becomes a link or an image.
function webURL(url) {
  try {
    const u = new URL(String(url), location.href);
    return u.protocol === 'https:' || u.protocol === 'http:' ? String(url) : null;
  } catch {
    return null;
  }
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function newCard(t) {
  const card = el('article', 'task');
  card.dataset.taskId = t.task_id;
  const asked = started.get(t.task_id) || {};
  const kind = t.kind || asked.kind;
  const thumb = el('div', 'thumb');
  thumb.append(el('span', 'kind', KIND[kind] || 'Video'), el('span', 'shimmer'), el('span', 'big', kind === 'image_to_video' ? '▣' : '✦'));
  const body = el('div', 'body');
  const row = el('div', 'row');
  row.append(el('span', 'badge status'), el('span', 'version'));
  const bar = el('div', 'bar');
  bar.setAttribute('role', 'progressbar');
  bar.setAttribute('aria-valuemin', '0');
  bar.setAttribute('aria-valuemax', '100');
  bar.append(el('div', 'fill'));
  const meta = el('div', 'meta');
  meta.append(el('span', 'stage'), el('span', 'pct'));
  const meta2 = el('div', 'meta');
  meta2.append(el('span', 'queue'), el('span', 'provider'));
  body.append(row, el('p', 'prompt', t.prompt || asked.prompt || 'Untitled generation'), bar, meta, meta2, el('div', 'outcome'));
  card.append(thumb, body);
  return card;
}

function failed(t) {
  return t.status === 'FAILED' || t.status === 'CANCELED';
}

// reason is what a failed task's card and the log say went wrong.
function reason(t) {
  const text = t.error_message || ERROR[t.error_code] || (t.status === 'CANCELED' ? 'The generation was canceled.' : 'The generation failed.');
  return `${text} (${t.error_code || t.status.toLowerCase()})`;
}

function renderTask(t) {
  let card = cards.get(t.task_id);
  if (!card) {
    card = newCard(t);
    cards.set(t.task_id, card);
    $('empty').hidden = true;
    $('tasks').prepend(card);
  } else if (Number(card.dataset.version) >= t.version) {
    return; // the client already dropped older versions; this guards the POST answer
  }
  const progress = Math.max(0, Math.min(100, Number(t.progress) || 0));
  card.dataset.status = t.status;
  card.dataset.version = String(t.version);
  card.dataset.progress = String(progress);
  const q = (s) => card.querySelector(s);
  const badge = q('.status');
  badge.textContent = STATUS[t.status] || t.status;
  badge.dataset.status = t.status;
  badge.title = t.status;
  q('.version').textContent = `v${t.version}`;
  q('.fill').style.width = `${progress}%`;
  q('.bar').setAttribute('aria-valuenow', String(progress));
  // A failed task makes no more progress: its card says it failed, not
  // where it was.
  const stage = STAGE[t.stage] || (t.stage ? t.stage.replaceAll('_', ' ') : '');
  q('.stage').textContent = failed(t) ? (t.status === 'CANCELED' ? 'Canceled' : 'Failed') : stage;
  q('.pct').textContent = failed(t) ? '' : `${progress}%`;
  q('.queue').textContent = t.status === 'QUEUED' && t.queue_position ? `#${t.queue_position} in queue` : '';
  q('.provider').textContent = [t.provider, t.model].filter(Boolean).join(' · ');
  const outcome = q('.outcome');
  outcome.replaceChildren();
  if (failed(t)) {
    outcome.append(el('span', 'error', reason(t)));
  } else if (t.status === 'SUCCEEDED' && t.output_asset_id) {
    const url = webURL(t.output_url || `/demo/assets/${encodeURIComponent(t.output_asset_id)}.svg`);
    if (!url) {
      outcome.append(el('span', null, 'Output ready'));
      renderCounts();
      return;
    }
    const a = el('a', null, 'Open output ↗');
    a.href = url;
    a.target = '_blank';
    a.rel = 'noopener noreferrer';
    outcome.append(a);
    if (!q('.thumb img')) {
      const img = el('img');
      img.alt = 'Output preview';
      img.src = url;
      q('.thumb').append(img);
    }
  }
  renderCounts();
}

function renderCounts() {
  let active = 0;
  let done = 0;
  let failed = 0;
  for (const card of cards.values()) {
    const s = card.dataset.status;
    if (s === 'SUCCEEDED') done++;
    else if (s === 'FAILED' || s === 'CANCELED') failed++;
    else active++;
  }
  $('count-active').textContent = String(active);
  $('count-done').textContent = String(done);
  $('count-failed').textContent = String(failed);
}

// logTask logs a task's transitions: its first state, each change of
// status and how it ended. A task first seen ended (a reload's listing) is
// history, not news.
function logTask(t, previous) {
  if (previous ? previous.status === t.status : isTerminal(t.status)) return;
  const name = taskName(t);
  const status = STATUS[t.status] || t.status;
  if (t.status === 'SUCCEEDED') log(`${name} is ready`, 'ok', t.task_id);
  else if (failed(t)) log(`${name} ${t.status === 'CANCELED' ? 'was canceled' : 'failed'}: ${reason(t)}`, 'warn', t.task_id);
  else if (!previous) log(`${name}: ${status}`, '', t.task_id);
  else log(`${name}: ${STATUS[previous.status] || previous.status} → ${status}`, '', t.task_id);
}

// taskName is what a person calls a task: its kind and prompt, shortened;
// the id only when the prompt is not known (a task this page did not start
// and PostgreSQL listed).
function taskName(t) {
  const kind = KIND[t.kind || started.get(t.task_id)?.kind] || 'Task';
  const prompt = (t.prompt || started.get(t.task_id)?.prompt || '').trim();
  if (!prompt) return `${kind} ${t.task_id}`;
  return `${kind} “${prompt.length > 40 ? `${prompt.slice(0, 41).replace(/\s+\S*$/, '')}…` : prompt}”`;
}

// inTime words a wait: "now" under a tenth of a second, then ms, then s.
function inTime(ms) {
  if (ms < 100) return 'now';
  if (ms < 1000) return `in ${Math.round(ms)} ms`;
  return `in ${(ms / 1000).toFixed(1)} s`;
}

// log adds a line to the activity log; taskId, when given, marks the line
// as the task's (data-task-id), for whoever needs the id behind the name.
function log(text, kind = '', taskId = '') {
  const li = el('li');
  li.dataset.kind = kind;
  if (taskId) li.dataset.taskId = taskId;
  const time = el('time', null, new Date().toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' }));
  li.append(time, el('span', null, text));
  const list = $('log');
  list.prepend(li);
  while (list.children.length > 30) list.lastChild.remove();
}

// --- actions -------------------------------------------------------------------

async function startTask(kind, button) {
  const notice = $('notice');
  notice.hidden = true;
  button.disabled = true;
  try {
    const token = currentToken || await getToken();
    const res = await fetch('/demo/tasks', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${token}` },
      body: JSON.stringify({ project_id: project, kind, prompt: $('prompt').value.trim(), fail: $('fail').checked }),
    });
    const body = await res.json().catch(() => ({}));
    if (res.status === 401) currentToken = ''; // the next start asks for a token again
    if (!res.ok) throw new Error(limitOf(body)?.message || body.message || `HTTP ${res.status}`);
    remember(body.task);
    client.offer(body.task); // shown at once; the stream brings what follows
    client.subscribe({ tasks: [body.task.task_id] });
  } catch (err) {
    notice.textContent = `Could not start the task: ${err.message}`;
    notice.hidden = false;
  } finally {
    button.disabled = false;
  }
}

for (const b of [$('start-t2v'), $('start-i2v')]) b.addEventListener('click', () => startTask(b.dataset.kind, b));

for (const b of [$('use-sse'), $('use-ws')]) {
  b.addEventListener('click', () => {
    const t = b.dataset.transport;
    if (t === client.transport) return;
    log(`Switching to ${TRANSPORT[t]}`);
    announce = true;
    client.setTransport(t);
    const u = new URL(location.href);
    u.searchParams.set('transport', t);
    history.replaceState(null, '', u);
  });
}

$('cut').addEventListener('click', () => {
  log('Connection cut from this page', 'warn');
  client.interrupt();
});

$('project-name').textContent = project.replaceAll('-', ' ').replace(/^\w/, (c) => c.toUpperCase());
renderConnection({ state: 'connecting', transport, serverMode: null, node: '' });

// Tests and the curious read the client from here.
window.pushdDemo = { client, isTerminal };
client.start();
