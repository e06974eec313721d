// The demo page: a project of video generations, watched live with the
// pushd client. Query parameters choose who and what:
//   tenant, user, project   (default demo, demo-user, launch-campaign)
//   transport               sse or ws (default sse)
//   #token=...              a token, for a node that serves no demo tokens
// and tune the client for tests and experiments (milliseconds):
//   hello_ms, fallback_after, poll_ms, stream_retry_ms, backoff_ms
import { PushdClient, isTerminal } from '/client/pushd.js';

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
const STATE = { idle: 'Idle', connecting: 'Connecting', streaming: 'Streaming', polling: 'Polling', closed: 'Closed' };
const TRANSPORT = { sse: 'Server-Sent Events', ws: 'WebSocket' };

// --- tokens ----------------------------------------------------------------

// A token can also come in the URL fragment (#token=...), which browsers
// never send to a server.
let pastedToken = new URLSearchParams(location.hash.slice(1)).get('token') || sessionStorage.getItem('pushd-demo-token') || '';

// getToken asks the embedded node for a demo token; a node with a
// configured secret serves none, and the page asks for one instead.
async function getToken() {
  const res = await fetch(`/demo/token?tenant=${encodeURIComponent(tenant)}&user=${encodeURIComponent(user)}`, { cache: 'no-store' });
  if (res.ok) return (await res.json()).token;
  if (res.status !== 404) throw new Error(`token: HTTP ${res.status}`);
  if (pastedToken) return pastedToken;
  return askToken();
}

function askToken() {
  const dialog = $('token-dialog');
  return new Promise((resolve) => {
    $('token-form').addEventListener('submit', () => {
      pastedToken = $('token-input').value.trim();
      sessionStorage.setItem('pushd-demo-token', pastedToken);
      resolve(pastedToken);
    }, { once: true });
    dialog.showModal();
  });
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
});

let reconnects = 0;
let lastNode = '';
let announce = true; // log the next hello: the first, or one after a loss or a switch

client.addEventListener('state', (e) => renderConnection(e.detail));
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
    ? `Stream unavailable (${reason}): polling over HTTP, trying to stream again in ${(delayMs / 1000).toFixed(1)} s`
    : `Connection lost (${reason}): reconnecting in ${(delayMs / 1000).toFixed(1)} s`, 'warn');
});
client.addEventListener('error', (e) => {
  const d = e.detail;
  if (d.code === 'not_found' && d.task_id) return; // a task not published yet arrives when it is
  log(`Server: ${d.code}${d.message ? ` (${d.message})` : ''}`, 'warn');
});
client.addEventListener('task', (e) => renderTask(e.detail.task));

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
  $('f-node').textContent = d.node || '—';
  $('f-node').title = d.node || '';
  $('use-sse').setAttribute('aria-pressed', String(d.transport === 'sse'));
  $('use-ws').setAttribute('aria-pressed', String(d.transport === 'ws'));
  const pill = $('conn-pill');
  pill.dataset.state = d.state;
  $('conn-pill-text').textContent = d.state === 'streaming'
    ? `Live · ${d.transport === 'ws' ? 'WebSocket' : 'SSE'}`
    : STATE[d.state] || d.state;
}

const cards = new Map(); // task_id -> card element

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function newCard(t) {
  const card = el('article', 'task');
  card.dataset.taskId = t.task_id;
  const thumb = el('div', 'thumb');
  thumb.append(el('span', 'kind', KIND[t.kind] || 'Video'), el('span', 'shimmer'), el('span', 'big', t.kind === 'image_to_video' ? '▣' : '✦'));
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
  body.append(row, el('p', 'prompt', t.prompt || 'Untitled generation'), bar, meta, meta2, el('div', 'outcome'));
  card.append(thumb, body);
  return card;
}

function renderTask(t) {
  if (t.project_id && t.project_id !== project) return;
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
  q('.stage').textContent = STAGE[t.stage] || (t.stage ? t.stage.replaceAll('_', ' ') : '');
  q('.pct').textContent = `${progress}%`;
  q('.queue').textContent = t.status === 'QUEUED' && t.queue_position ? `#${t.queue_position} in queue` : '';
  q('.provider').textContent = [t.provider, t.model].filter(Boolean).join(' · ');
  const outcome = q('.outcome');
  outcome.replaceChildren();
  if (t.status === 'FAILED' || t.status === 'CANCELED') {
    outcome.append(el('span', 'error', `${t.error_message || 'The generation failed.'} (${t.error_code || t.status.toLowerCase()})`));
  } else if (t.status === 'SUCCEEDED' && t.output_asset_id) {
    const url = t.output_url || `/demo/assets/${encodeURIComponent(t.output_asset_id)}.svg`;
    const a = el('a', null, 'Open output ↗');
    a.href = url;
    a.target = '_blank';
    a.rel = 'noopener';
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

function log(text, kind = '') {
  const li = el('li');
  li.dataset.kind = kind;
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
    const token = await getToken();
    const res = await fetch('/demo/tasks', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${token}` },
      body: JSON.stringify({ project_id: project, kind, prompt: $('prompt').value.trim(), fail: $('fail').checked }),
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(body.message || `HTTP ${res.status}`);
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

$('who').textContent = `${user} · tenant ${tenant}`;
$('project-name').textContent = project.replaceAll('-', ' ').replace(/^\w/, (c) => c.toUpperCase());
renderConnection({ state: 'connecting', transport, serverMode: null, node: '' });

// Tests and the curious read the client from here.
window.pushdDemo = { client, isTerminal };
client.start();
