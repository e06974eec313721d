// pushd.js: the browser client of pushd, a real-time task status server.
// A dependency-free ES module; the types are in pushd.d.ts beside it.
//
//   import { PushdClient } from '/client/pushd.js';
//   const client = new PushdClient({ token: () => fetchToken(), projects: ['p1'] });
//   client.addEventListener('task', (e) => render(e.detail.task));
//   client.addEventListener('state', (e) => showState(e.detail));
//   client.start();
//
// What it does, and why:
// - Streams over SSE (EventSource) by default, or WebSocket (subprotocol
//   pushd.v1) on request.
// - Keeps the newest version of every task and drops anything older or
//   equal: after a reconnect, a poll and a stream may overlap.
// - Resumes where it left off: SSE passes the last event id (of a task or,
//   from a node with streams, of the sync that completes the initial state)
//   as last_event_id, WebSocket sends the versions it holds as "since", so
//   the server skips what did not move.
// - Reconnects itself (the EventSource's own retries are not used, so one
//   policy covers both transports): exponential backoff with full jitter;
//   a server's reconnect hint (sent before a drain) or Retry-After on a 429
//   sets the delay instead. A node tells an EventSource of a refusal that
//   passes (a limit, a cap, a draining node) in the stream, as an error
//   event with the 429's or 503's body, read like that body. An EventSource
//   cannot see status codes, so after any other connection that failed
//   before its hello the client probes the same URL with fetch to read the
//   status.
// - Tells the page of a refusal that does not pass (a 401, a 403, a 400)
//   with an error event carrying the server's code and the status, and
//   neither retries nor polls into it: the client closes, unless the
//   refusal is a 401 and the token option a function, which is asked for
//   a new token before the next attempt.
// - Asks again for ids the server refused rate_limit_exceeded (its read
//   budget for the user) once their retry_after_ms has passed, plus jitter:
//   a subscribe of those ids on WebSocket, a reconnect with the cursor on SSE.
// - Tells the page of every refusal for a limit (a 429 on connect or poll,
//   a refused subscription or request) with a `limited` event carrying the
//   wait and the platform's message, "too many requests, try again in 30 s".
// - Falls back to polling GET /v1/tasks?ids= (and a project's task list)
//   when it cannot hold a stream: after repeated failures, or when no hello
//   arrives in time (a proxy that buffers the response); it keeps trying to
//   stream in the background and stops polling once a stream says hello.
// - Over WebSocket, refreshes the token on the open connection before the
//   JWT's exp (a fifth of its life before, at most a minute), with a token
//   function: the connection outlives the token. SSE cannot send one; its
//   stream ends at exp and the client reconnects with a fresh token and
//   its cursor, missing nothing.
// - Treats a connection that has been silent for the server's heartbeat
//   interval (hello's heartbeat_ms) plus a grace as dead, and reconnects,
//   resuming: a link that went silent without closing (a half-open
//   connection) is otherwise reported by neither EventSource nor WebSocket
//   for many minutes. The server sends an idle connection a heartbeat
//   event or message, which both can see.
// - Takes every wait a server names (a reconnect hint, Retry-After, a
//   refusal's retry_after_ms, hello's heartbeat_ms) as at most 5 minutes,
//   and one that is not a finite number from 0 up as none: a timer fires
//   a wait past 2^31-1 ms at once, and a hostile or broken server could
//   otherwise turn its wait into a storm of reconnects.
// - Knows more than one node when given urls: it starts at one picked at
//   random, so a fleet's clients spread over the list, and moves on to the
//   next after a connection fails or its node drains, resuming with its
//   cursor. A balancer in front of the nodes stays the usual setup.
// - Reports its state ("connecting", "streaming", "polling", "idle",
//   "closed") and the server's mode ("push" or "polling") as events: a
//   state event each time what it reports changes, once.

const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELED']);

// ignore is the error listener of every WebSocket: what failed is learned
// from the close that follows.
const ignore = () => {};

/**
 * The grace added to the server's heartbeat interval before a silent
 * connection is taken for dead: the server writes a heartbeat up to a
 * second after the interval, and a lost TCP segment is resent after 1, 2
 * and 4 s; the server gives a client that stops reading its write
 * timeout, 10 s by default, and the client gives the server as long.
 */
export const HEARTBEAT_GRACE_MS = 10000;

/**
 * The longest wait the client takes from a server: a reconnect hint's
 * after_ms, a Retry-After (seconds or a date), a refusal's retry_after_ms
 * or retry_after. A longer one is taken as this long; the jitter the
 * client adds to a refusal's wait comes on top. A node names seconds; a
 * timer fires a wait past 2^31-1 ms at once, so a server that named more
 * set off a storm of reconnects.
 */
export const MAX_SERVER_WAIT_MS = 300000;

/**
 * The longest heartbeat interval the client takes from a hello's
 * heartbeat_ms, so a connection silent for at most this plus
 * HEARTBEAT_GRACE_MS is taken for dead.
 */
export const MAX_HEARTBEAT_MS = 300000;

// serverWait reads a wait in ms a server named (or a token's remaining
// life): a finite number from 0 up, at most ceiling. Anything else, a
// string, NaN, Infinity (JSON's 1e400) or a negative number, is null, as
// if the server had named none. Every such wait goes through here before
// it reaches a timer.
function serverWait(ms, ceiling = MAX_SERVER_WAIT_MS) {
  return typeof ms === 'number' && Number.isFinite(ms) && ms >= 0 ? Math.min(ms, ceiling) : null;
}

/** Client states, the `state` of a `state` event. */
export const State = Object.freeze({
  IDLE: 'idle', // nothing subscribed: no connection is needed
  CONNECTING: 'connecting',
  STREAMING: 'streaming',
  POLLING: 'polling',
  CLOSED: 'closed',
});

const DEFAULTS = {
  url: '',
  urls: [],
  transport: 'sse',
  tasks: [],
  projects: [],
  user: false,
  backoffBaseMs: 500,
  backoffMaxMs: 30000,
  helloTimeoutMs: 10000,
  fallbackAfter: 3,
  pollIntervalMs: 3000,
  streamRetryMs: 30000,
  probeTimeoutMs: 5000,
  maxIds: 100,
};

/** Is the status one a task never leaves? */
export function isTerminal(status) {
  return TERMINAL.has(status);
}

// jwtExpiry is a JWT's exp in Unix ms, or null for a token that is not a
// JWT (an opaque session token) or has none.
function jwtExpiry(token) {
  const parts = typeof token === 'string' ? token.split('.') : [];
  if (parts.length !== 3) return null;
  try {
    const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
    const exp = JSON.parse(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4))).exp;
    return typeof exp === 'number' && Number.isFinite(exp * 1000) ? exp * 1000 : null;
  } catch {
    return null;
  }
}

/**
 * fullJitter is the delay before reconnect attempt `attempt` (0 first):
 * uniform in [0, min(max, base * 2^attempt)), so a fleet of clients that
 * lost the same node does not come back together.
 */
export function fullJitter(attempt, baseMs, maxMs, random = Math.random) {
  const cap = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * cap);
}

// The codes of refusals for a limit: a rate limit, and a cap on open
// connections. Both come with retry_after (s) and retry_after_ms.
const LIMIT_CODES = new Set(['rate_limit_exceeded', 'too_many_connections']);

/** limitMessage is the platform's message for a refusal for a limit, waiting `seconds`. */
export function limitMessage(seconds) {
  return `too many requests, try again in ${seconds} s`;
}

/**
 * limitOf reads a refusal for a limit: a 429 body, an SSE error event or a
 * WebSocket error or rejection. The server's retry_after (whole seconds,
 * rounded up) is the one the message shows; without it the milliseconds
 * are rounded up, and without either `fallbackMs` is. Each is taken as at
 * most MAX_SERVER_WAIT_MS. Null when the code is not a limit's.
 */
export function limitOf(m, fallbackMs = null) {
  if (!m || !LIMIT_CODES.has(m.code ?? m.error)) return null;
  let ms = serverWait(m.retry_after_ms);
  let s = serverWait(m.retry_after, MAX_SERVER_WAIT_MS / 1000);
  if (!(ms > 0)) ms = s > 0 ? s * 1000 : serverWait(fallbackMs);
  if (!(ms > 0)) ms = 1000;
  if (!(s > 0)) s = Math.ceil(ms / 1000);
  return { code: m.code ?? m.error, retryAfter: s, retryAfterMs: ms, message: limitMessage(s) };
}

/**
 * parseRetryAfter reads a Retry-After header (seconds or an HTTP date) as
 * ms, at most MAX_SERVER_WAIT_MS; null when absent or malformed.
 */
export function parseRetryAfter(value, now = Date.now()) {
  if (value == null || value === '') return null;
  if (/^\d+$/.test(value.trim())) return serverWait(Number(value.trim()) * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : serverWait(Math.max(0, at - now));
}

// limitOfResponse reads a 429's body as limitOf does; a body that is not
// pushd's (a proxy's 429) is a rate limit of Retry-After's wait.
async function limitOfResponse(res, retryAfterMs) {
  const body = await res.json().catch(() => null);
  return limitOf(body, retryAfterMs) || limitOf({ code: 'rate_limit_exceeded' }, retryAfterMs);
}

// Statuses of refusals that do not pass by themselves: a refused token, a
// foreign origin, a malformed request. The same request meets the same
// answer, and so would a poll.
const DENIALS = new Set([400, 401, 403]);

// denialOfResponse reads such a refusal's body ({"error", "message"}) as an
// error event's detail; a proxy's body that is not one still gives the status.
async function denialOfResponse(res) {
  const body = await res.json().catch(() => null);
  const code = typeof body?.error === 'string' ? body.error : `http_${res.status}`;
  return { code, message: typeof body?.message === 'string' ? body.message : '', status: res.status };
}

// refusalOf reads a refusal a node sent in an event stream (an error event
// whose data is a 429's or 503's body) as #probe reads the status: the
// status its code comes with, the wait, and the limit when it is one.
function refusalOf(m) {
  const ms = serverWait(m.retry_after_ms);
  return { code: LIMIT_CODES.has(m.error) ? 429 : 503, waitMs: ms > 0 ? ms : null, limit: limitOf(m) };
}

export class PushdClient extends EventTarget {
  // Settings.
  #opt;
  // The servers' origins and path prefixes, without a trailing slash: the
  // urls option, or the url option (the page's origin by default) alone.
  #bases;
  #baseAt = 0; // the one connections and polls go to now
  get #base() { return this.#bases[this.#baseAt]; }

  // What the page asked for. Terminal tasks leave #wantTasks (nothing more
  // will come for them); held non-terminal tasks are resubscribed on every
  // connect, so a reconnect resumes them even when the server learned of
  // them through a project listing it can no longer produce.
  #wantTasks = new Set();
  #wantProjects = new Set();
  #wantUser = false;

  #tasks = new Map(); // task_id -> newest snapshot
  #state = State.IDLE;
  #transport;
  #serverMode = null;
  #serverReason = '';
  #node = '';
  #cursor = ''; // the last SSE event id
  #tokenValue = null;
  #started = false;

  // The current connection attempt. Every callback checks its generation,
  // so events of a connection the client already left are ignored.
  #gen = 0;
  #es = null;
  #ws = null;
  #wsReqID = 0;
  #helloSeen = false;
  #helloTimer = null;
  #lastHeard = 0; // Date.now() when the connection last sent anything
  #liveTimer = null; // ends a connection silent past heartbeat_ms plus the grace
  #refreshTimer = null;
  #limitTimer = null; // asks again for ids refused rate_limit_exceeded
  #retryTimer = null;
  #hintMs = null; // a server's reconnect hint for the next attempt
  #attempt = 0; // reconnects since the last hello, for the backoff
  #failures = 0; // connections that failed in a row, for the fallback

  #polling = false;
  #pollTimer = null;
  #pollBusy = false;
  #etags = new Map(); // poll URL -> ETag the server sent for it

  #stats = { received: 0, dropped: 0, reconnects: 0, polls: 0, fallbacks: 0, heartbeats: 0 };

  /** @param {import('./pushd').ClientOptions} options */
  constructor(options = {}) {
    super();
    // An option set to undefined keeps its default.
    this.#opt = { ...DEFAULTS };
    for (const [k, v] of Object.entries(options)) if (v !== undefined) this.#opt[k] = v;
    const origin = typeof location !== 'undefined' ? location.origin : '';
    const urls = Array.isArray(this.#opt.urls) ? this.#opt.urls : [];
    if (urls.length && this.#opt.url) throw new TypeError('pushd: pass options.url or options.urls, not both');
    this.#bases = (urls.length ? urls : [this.#opt.url || origin]).map((u) => String(u || '').replace(/\/+$/, ''));
    if (this.#bases.some((b) => !b)) throw new TypeError('pushd: options.url is required outside a browser page');
    // Each client starts at a node of its own, so a list spreads a fleet's
    // clients as a balancer would.
    this.#baseAt = Math.floor(Math.random() * this.#bases.length);
    this.#transport = this.#opt.transport === 'ws' ? 'ws' : 'sse';
    // Outside a browser (Node.js) the page passes the constructors in.
    this.#WebSocket = this.#opt.WebSocket ?? globalThis.WebSocket;
    this.#EventSource = this.#opt.EventSource ?? globalThis.EventSource;
    if (typeof (this.#transport === 'ws' ? this.#WebSocket : this.#EventSource) !== 'function') {
      const [name, pkg] = this.#transport === 'ws' ? ['WebSocket', 'ws'] : ['EventSource', 'eventsource'];
      throw new TypeError(`pushd: no ${name} here: pass options.${name} (in Node.js, the ${pkg} package's)`);
    }
    for (const id of this.#opt.tasks) this.#wantTasks.add(id);
    for (const id of this.#opt.projects) this.#wantProjects.add(id);
    this.#wantUser = !!this.#opt.user;
    this.#online = () => {
      // The network is back: do not sit out the rest of a long backoff.
      if (this.#retryTimer && !this.#polling) this.#reconnectNow();
    };
  }

  #online;
  #WebSocket;
  #EventSource;

  get state() { return this.#state; }
  get transport() { return this.#transport; }
  get serverMode() { return this.#serverMode; }
  get node() { return this.#node; }
  /** The URL the client connects and polls to now: one of options.urls, or options.url. */
  get url() { return this.#base; }
  /** The newest snapshot of every task the client holds. */
  get tasks() { return new Map(this.#tasks); }
  get stats() { return { ...this.#stats }; }

  /** The newest snapshot of a task, or undefined. */
  task(id) { return this.#tasks.get(id); }

  /** Connects (or, with nothing subscribed, waits for a subscription). */
  start() {
    if (this.#started) return;
    this.#started = true;
    if (typeof addEventListener === 'function') addEventListener('online', this.#online);
    this.#connect();
  }

  /** Closes the connection and stops every timer; the client can be started again. */
  close() { this.#close(''); }

  #close(reason) {
    this.#started = false;
    if (typeof removeEventListener === 'function') removeEventListener('online', this.#online);
    this.#teardown();
    this.#stopPolling();
    this.#clearRetry();
    this.#setState(State.CLOSED, reason);
  }

  // #denied tells the page of a refusal that does not pass (an error event
  // with the server's code and the status) and closes the client unless
  // trying again can change the answer: a 401 with a token function, which
  // is asked for a new token. It reports whether it closed the client.
  #denied(denial) {
    this.#emit('error', denial);
    if (denial.status === 401 && typeof this.#opt.token === 'function') {
      this.#tokenValue = null;
      return false;
    }
    this.#close(`http_${denial.status}`);
    return true;
  }

  /** Adds tasks, projects or the user scope to what the client watches. */
  subscribe({ tasks = [], projects = [], user = false } = {}) {
    const newTasks = tasks.filter((id) => !this.#wantTasks.has(id) && !isTerminal(this.#tasks.get(id)?.status));
    const newProjects = projects.filter((id) => !this.#wantProjects.has(id));
    const newUser = user && !this.#wantUser;
    if (!newTasks.length && !newProjects.length && !newUser) return;
    newTasks.forEach((id) => {
      this.#wantTasks.add(id);
      this.#forgotten.delete(id);
    });
    newProjects.forEach((id) => this.#wantProjects.add(id));
    if (newUser) this.#wantUser = true;
    this.#changed({ op: 'subscribe', tasks: newTasks, projects: newProjects, user: newUser });
  }

  /** Stops watching tasks or projects. Their snapshots stay held; forget() drops them. */
  unsubscribe({ tasks = [], projects = [] } = {}) {
    const goneTasks = tasks.filter((id) => this.#wantTasks.delete(id) || this.#tasks.has(id));
    const goneProjects = projects.filter((id) => this.#wantProjects.delete(id));
    if (!goneTasks.length && !goneProjects.length) return;
    for (const id of goneTasks) this.#forgotten.add(id);
    this.#changed({ op: 'unsubscribe', tasks: goneTasks, projects: goneProjects });
  }

  #forgotten = new Set(); // unsubscribed tasks: not resubscribed from #tasks

  /**
   * Hands the client a snapshot the page got elsewhere, such as the answer
   * of the request that created the task. It is kept only if newer than the
   * one held, and announced by a task event like any other.
   */
  offer(snapshot) { this.#offer(snapshot, 'page'); }

  /** Drops a held snapshot (after unsubscribe, so it does not come back). */
  forget(id) { this.#tasks.delete(id); }

  /** Switches between 'sse' and 'ws'; reconnects at once when they differ. */
  setTransport(transport) {
    const t = transport === 'ws' ? 'ws' : 'sse';
    if (t === this.#transport) return;
    this.#transport = t;
    this.#cursor = ''; // an SSE cursor means nothing to another connection
    this.#emitState();
    if (this.#started) this.#reconnectNow();
  }

  /**
   * Drops the current connection as a network failure would; the client
   * then reconnects by its usual policy. For demos and tests.
   */
  interrupt() {
    if (!this.#es && !this.#ws) return;
    this.#fail(this.#gen, { reason: 'interrupted', probe: false });
  }

  // --- connections ---------------------------------------------------------

  #subscription() {
    const tasks = new Set(this.#wantTasks);
    for (const [id, snap] of this.#tasks) {
      if (!isTerminal(snap.status) && !this.#forgotten.has(id)) tasks.add(id);
    }
    const projects = [...this.#wantProjects];
    // The server takes at most maxIds tasks and projects per connection;
    // the explicitly wanted tasks come first.
    const room = Math.max(0, this.#opt.maxIds - projects.length);
    return { tasks: [...tasks].slice(0, room), projects, user: this.#wantUser };
  }

  #empty() {
    const s = this.#subscription();
    return !s.tasks.length && !s.projects.length && !s.user;
  }

  async #connect() {
    this.#teardown();
    this.#clearRetry();
    if (!this.#started) return;
    if (this.#empty()) {
      this.#stopPolling();
      this.#setState(State.IDLE);
      return;
    }
    const gen = ++this.#gen;
    if (!this.#polling) this.#setState(State.CONNECTING);
    let token;
    try {
      token = await this.#token(false);
    } catch (err) {
      if (gen !== this.#gen) return;
      this.#emit('error', { code: 'token', message: String(err?.message || err) });
      this.#fail(gen, { reason: 'token', probe: false });
      return;
    }
    if (gen !== this.#gen || !this.#started) return;
    this.#helloSeen = false;
    this.#helloTimer = setTimeout(() => {
      if (gen !== this.#gen || this.#helloSeen) return;
      // Headers may have arrived, but not a byte of the stream: something
      // between us and the server buffers it. Retrying will not help soon.
      this.#emit('error', { code: 'no_hello', message: `no hello within ${this.#opt.helloTimeoutMs} ms` });
      this.#failures = Math.max(this.#failures, this.#opt.fallbackAfter - 1);
      this.#fail(gen, { reason: 'no_hello', probe: false });
    }, this.#opt.helloTimeoutMs);
    if (this.#transport === 'ws') this.#openWS(gen, token);
    else this.#openSSE(gen, token);
  }

  #sseURL(token, { cursor = true } = {}) {
    const q = new URLSearchParams();
    const s = this.#subscription();
    s.tasks.forEach((id) => q.append('task', id));
    s.projects.forEach((id) => q.append('project', id));
    if (s.user) q.append('scope', 'user');
    if (cursor && this.#cursor) q.set('last_event_id', this.#cursor);
    q.set('access_token', token);
    return `${this.#base}/v1/events?${q}`;
  }

  #openSSE(gen, token) {
    let es;
    try {
      es = new this.#EventSource(this.#sseURL(token));
    } catch {
      // A URL the constructor refuses: a failed connect like any other.
      this.#fail(gen, { reason: 'sse_error', probe: false });
      return;
    }
    this.#es = es;
    const json = (e) => {
      try {
        return JSON.parse(e.data);
      } catch {
        return null;
      }
    };
    // Any event says the connection lives; registered first, so the
    // silence is over before the event's own listener runs.
    for (const type of ['hello', 'task', 'mode', 'sync', 'reconnect', 'error', 'heartbeat']) {
      es.addEventListener(type, () => gen === this.#gen && this.#heard());
    }
    es.addEventListener('heartbeat', () => gen === this.#gen && this.#stats.heartbeats++);
    es.addEventListener('hello', (e) => gen === this.#gen && this.#hello(gen, json(e)));
    es.addEventListener('task', (e) => {
      if (gen !== this.#gen) return;
      if (e.lastEventId) this.#cursor = e.lastEventId;
      const snap = json(e);
      if (snap) this.#offer(snap, 'sse');
    });
    es.addEventListener('mode', (e) => gen === this.#gen && this.#mode(json(e)));
    es.addEventListener('sync', (e) => {
      if (gen !== this.#gen) return;
      // A node with streams: the initial state is complete as of this
      // cursor. Resuming from it replays only what came after; the last
      // task's cursor, older, would replay more, or be too far behind to
      // replay at all in a busy tenant.
      if (e.lastEventId) this.#cursor = e.lastEventId;
      this.#emit('sync', { cursor: e.lastEventId });
    });
    es.addEventListener('reconnect', (e) => {
      if (gen !== this.#gen) return;
      const m = json(e);
      this.#hint(m?.after_ms);
    });
    es.addEventListener('error', (e) => {
      if (gen !== this.#gen) return;
      if (typeof e.data === 'string') {
        const m = json(e);
        if (typeof m?.error === 'string') {
          // The node refused the connection for a while and said so in the
          // stream, which ends next: what a probe reads of a 429 or 503.
          this.#fail(gen, { reason: 'stream_error', refused: refusalOf(m) });
          return;
        }
        // The server's "event: error": a refused subscription, not a failure.
        if (m?.code === 'token_expired') this.#tokenValue = null; // the stream ends next; reconnect with a new one
        if (m?.code === 'rate_limit_exceeded') {
          // An SSE stream's subscription is its URL: ask again by
          // reconnecting (with the cursor) once the budget allows.
          this.#afterLimit(gen, [m], () => {
            this.#hintMs = 0;
            this.#fail(gen, { reason: 'rate_limit_exceeded', probe: false });
          });
        }
        if (m) this.#emit('error', m);
        return;
      }
      // The connection failed or ended. EventSource would retry by itself
      // (and gives up on an HTTP error status); the client takes over.
      this.#fail(gen, { reason: 'stream_error', probe: !this.#helloSeen, probeURL: () => this.#sseURL(token, { cursor: false }) });
    });
  }

  #openWS(gen, token) {
    let ws;
    try {
      const u = new URL(`${this.#base}/v1/ws`);
      u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
      u.searchParams.set('access_token', token);
      ws = new this.#WebSocket(u.toString(), 'pushd.v1');
    } catch {
      this.#fail(gen, { reason: 'ws_error', probe: false });
      return;
    }
    this.#ws = ws;
    // A socket's error is always followed by its close event, which plans
    // the next attempt (the hello timer and the liveness rule stand behind
    // it). The listener is still needed: the ws package's WebSocket is an
    // EventEmitter, which throws an error nobody listens for at the process
    // (a refused connection killed a Node.js client). It stays on after
    // teardown, whose close of a connecting socket errors too.
    ws.onerror = ignore;
    ws.onopen = () => {
      if (gen !== this.#gen) return;
      const s = this.#subscription();
      const since = {};
      for (const id of [...s.tasks, ...this.#heldIDs(s.tasks)].slice(0, this.#opt.maxIds)) {
        const v = this.#tasks.get(id)?.version;
        if (v) since[id] = v;
      }
      const req = { op: 'subscribe', id: ++this.#wsReqID, tasks: s.tasks, projects: s.projects };
      if (s.user) req.scope = 'user';
      if (Object.keys(since).length) req.since = since;
      this.#send(req);
      this.#planRefresh(gen, token);
    };
    ws.onmessage = (e) => {
      if (gen !== this.#gen) return;
      this.#heard();
      if (typeof e.data !== 'string') return;
      let m;
      try {
        m = JSON.parse(e.data);
      } catch {
        return;
      }
      switch (m.type) {
        case 'hello': this.#hello(gen, m); break;
        case 'heartbeat': this.#stats.heartbeats++; break;
        case 'task': if (m.task) this.#offer(m.task, 'ws'); break;
        case 'mode': this.#mode(m); break;
        case 'ack': {
          const limited = (m.rejected || []).filter((r) => r.code === 'rate_limit_exceeded');
          if (limited.length) {
            this.#afterLimit(gen, limited, () => {
              const req = { op: 'subscribe', id: ++this.#wsReqID, tasks: [], projects: [] };
              for (const r of limited) {
                if (r.task_id) req.tasks.push(r.task_id);
                else if (r.project_id) req.projects.push(r.project_id);
                else req.scope = 'user';
              }
              this.#send(req);
            });
          }
          for (const r of m.rejected || []) this.#emit('error', r);
          break;
        }
        case 'error':
          if (m.code === 'token_expired') this.#tokenValue = null;
          this.#emit('error', m);
          // A request dropped for the connection's request rate.
          if (limitOf(m)) this.#limited(limitOf(m), 'request');
          break;
        case 'reconnect': this.#hint(m.after_ms); break;
      }
    };
    ws.onclose = (e) => {
      if (gen !== this.#gen) return;
      if (e.code === 4001 || e.code === 4003) this.#tokenValue = null; // token expired or refused: fetch a new one
      this.#fail(gen, {
        reason: `ws_close_${e.code}`,
        probe: !this.#helloSeen,
        probeURL: () => {
          const p = new URL(`${this.#base}/v1/ws`);
          p.searchParams.set('access_token', token);
          return p.toString();
        },
      });
    };
  }

  // Versions of held tasks outside the subscription's task list (tasks of
  // subscribed projects), so "since" covers them too.
  #heldIDs(exclude) {
    const skip = new Set(exclude);
    return [...this.#tasks.keys()].filter((id) => !skip.has(id));
  }

  // #planRefresh sends the connection of generation gen a fresh token a
  // fifth of the current one's remaining life before its exp (at most a
  // minute before), when the token is a JWT and the token option a
  // function that can give a fresh one; the node then ends the connection
  // at the new exp instead.
  #planRefresh(gen, token) {
    clearTimeout(this.#refreshTimer);
    this.#refreshTimer = null;
    const exp = jwtExpiry(token);
    if (exp == null || typeof this.#opt.token !== 'function') return;
    const left = exp - Date.now();
    this.#refreshAt(gen, Date.now() + Math.max(left - Math.min(60000, left / 5), 0));
  }

  // #refreshAt sends a fresh token at time at (Unix ms). A timer cannot
  // wait past 2^31-1 ms (about 24 days; a longer wait fires at once, and a
  // long-lived token was refreshed back to back), so the wait is taken in
  // steps of at most MAX_SERVER_WAIT_MS.
  #refreshAt(gen, at) {
    this.#refreshTimer = setTimeout(async () => {
      this.#refreshTimer = null;
      if (Date.now() < at) {
        this.#refreshAt(gen, at);
        return;
      }
      let fresh;
      try {
        fresh = await this.#token(true);
      } catch (err) {
        this.#emit('error', { code: 'token', message: String(err?.message || err) });
        return; // the stream ends at exp; the reconnect asks again
      }
      if (gen !== this.#gen || !this.#ws) return;
      this.#send({ op: 'refresh', id: ++this.#wsReqID, token: fresh });
      this.#planRefresh(gen, fresh);
    }, serverWait(Math.max(0, at - Date.now())));
  }

  #send(msg) {
    try {
      this.#ws?.send(JSON.stringify(msg));
    } catch {
      // Not open: the next connection sends the whole subscription.
    }
  }

  #hello(gen, m) {
    clearTimeout(this.#helloTimer);
    this.#helloSeen = true;
    this.#watchLiveness(gen, m?.heartbeat_ms);
    this.#attempt = 0;
    this.#failures = 0;
    const prevMode = this.#serverMode;
    if (m) {
      this.#node = m.node || '';
      this.#serverMode = m.mode || null;
      this.#serverReason = m.reason || '';
    }
    const wasPolling = this.#polling;
    this.#stopPolling();
    // One state event for all of it: the state, the node and the mode the
    // hello brought (a new node or mode while already streaming included).
    this.#state = State.STREAMING;
    this.#emitState();
    this.#emit('hello', { ...m, transport: this.#transport, resumed: wasPolling });
    // The mode may have changed while no connection was there to hear it.
    if (prevMode && this.#serverMode && prevMode !== this.#serverMode) {
      this.#emit('mode', { mode: this.#serverMode, reason: this.#serverReason });
    }
  }

  #heard() {
    this.#lastHeard = Date.now();
  }

  // #watchLiveness ends the connection of generation gen once it has sent
  // nothing for heartbeatMs plus the grace: the server sends an idle
  // connection a heartbeat every heartbeatMs, so a longer silence is a
  // dead link. One timer per connection, pushed back when it fires early
  // rather than reset by every message; wall-clock time, so a computer
  // that slept finds its connection stale as soon as it wakes.
  #watchLiveness(gen, heartbeatMs) {
    clearTimeout(this.#liveTimer);
    this.#liveTimer = null;
    heartbeatMs = serverWait(heartbeatMs, MAX_HEARTBEAT_MS);
    if (!(heartbeatMs > 0)) return;
    const limit = heartbeatMs + HEARTBEAT_GRACE_MS;
    const check = () => {
      this.#liveTimer = null;
      if (gen !== this.#gen) return;
      const silent = Date.now() - this.#lastHeard;
      if (silent >= limit) {
        this.#fail(gen, { reason: 'silent', probe: false });
        return;
      }
      this.#liveTimer = setTimeout(check, limit - silent);
    };
    this.#liveTimer = setTimeout(check, limit);
  }

  #mode(m) {
    if (!m) return;
    this.#serverMode = m.mode;
    this.#serverReason = m.reason || '';
    this.#emit('mode', { mode: m.mode, reason: m.reason || '' });
    this.#emitState();
  }

  // #afterLimit runs ask once the longest retry_after_ms of the refusals
  // has passed, plus up to half of it again so that a page's many
  // connections do not come back together; refusals arriving meanwhile
  // join the same wait on SSE, and ask for their own ids on WebSocket.
  // Each wait it starts is announced once, with the longest refusal's.
  #afterLimit(gen, refusals, ask) {
    const longest = refusals.map((r) => limitOf(r)).reduce((a, b) => (b.retryAfterMs > a.retryAfterMs ? b : a));
    const wait = Math.max(1, longest.retryAfterMs);
    const delay = wait + Math.random() * wait / 2;
    if (this.#transport === 'sse') {
      if (this.#limitTimer) return;
      this.#limited(longest, 'subscribe');
      this.#limitTimer = setTimeout(() => {
        this.#limitTimer = null;
        if (gen === this.#gen) ask();
      }, delay);
      return;
    }
    this.#limited(longest, 'subscribe');
    setTimeout(() => gen === this.#gen && ask(), delay);
  }

  // #limited announces a refusal for a limit; source says what was refused.
  #limited(limit, source) {
    this.#emit('limited', { ...limit, source });
  }

  #hint(afterMs) {
    // Used when the connection ends, which the server does next.
    const ms = serverWait(afterMs);
    if (ms != null) this.#hintMs = ms;
  }

  // #fail ends the connection of generation gen and plans the next one.
  // refused is what the server said of a refusal (refusalOf), when it did.
  async #fail(gen, { reason, probe, probeURL, refused }) {
    if (gen !== this.#gen) return;
    const hadHello = this.#helloSeen;
    this.#teardown();
    this.#gen++; // late events of the failed connection are ignored
    const mine = this.#gen;
    let delay;
    if (this.#hintMs != null) {
      // The server asked us to come back after this long (a drain): not a failure.
      delay = this.#hintMs;
      reason = 'server_reconnect';
      this.#hintMs = null;
    } else {
      delay = fullJitter(this.#attempt++, this.#opt.backoffBaseMs, this.#opt.backoffMaxMs);
      let status = refused;
      if (!status && probe && probeURL) {
        status = await this.#probe(probeURL());
        if (mine !== this.#gen || !this.#started) return;
      }
      if (status) {
        if (status.waitMs != null) delay = Math.max(delay, status.waitMs);
        if (status.limit) this.#limited(status.limit, 'connect');
        reason = `http_${status.code}`;
      }
      // A denial is not the transport failing: polling would meet it too.
      if (status?.denial) {
        if (this.#denied(status.denial)) return;
      } else if (!hadHello) this.#failures++;
    }
    if (!this.#started) return;
    // The node failed or drains: the next of the list may not. The cursor
    // goes along: the nodes of a fleet share what it names.
    if (this.#bases.length > 1) this.#baseAt = (this.#baseAt + 1) % this.#bases.length;
    if (!this.#polling && this.#failures >= this.#opt.fallbackAfter) {
      this.#stats.fallbacks++;
      this.#startPolling(reason);
    }
    if (this.#polling) delay = Math.max(delay, this.#opt.streamRetryMs);
    else this.#setState(State.CONNECTING);
    this.#stats.reconnects++;
    this.#emit('reconnecting', { delayMs: delay, reason, attempt: this.#attempt, polling: this.#polling, url: this.#base });
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = null;
      this.#connect();
    }, delay);
  }

  // #probe asks for the stream's URL with fetch to learn the status an
  // EventSource or WebSocket cannot see; it reads no body but a 429's,
  // which says what limit refused and for how long. It does not accept
  // text/event-stream: a node answers a refusal that passes to one that
  // does in a 200 stream, and the probe wants the status.
  async #probe(url) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), this.#opt.probeTimeoutMs);
    try {
      const res = await fetch(url, { signal: ctl.signal, cache: 'no-store' });
      const retryAfterMs = parseRetryAfter(res.headers.get('Retry-After'));
      const limit = res.status === 429 ? await limitOfResponse(res, retryAfterMs) : null;
      const denial = DENIALS.has(res.status) ? await denialOfResponse(res) : null;
      return { code: res.status, waitMs: res.status === 429 ? retryAfterMs : null, limit, denial };
    } catch {
      return null;
    } finally {
      clearTimeout(timer);
      ctl.abort(); // a probe that got a stream must not hold it
    }
  }

  #teardown() {
    clearTimeout(this.#helloTimer);
    this.#helloTimer = null;
    clearTimeout(this.#liveTimer);
    this.#liveTimer = null;
    clearTimeout(this.#refreshTimer);
    this.#refreshTimer = null;
    clearTimeout(this.#limitTimer);
    this.#limitTimer = null;
    if (this.#es) {
      const es = this.#es;
      this.#es = null;
      try {
        es.close();
      } catch {
        // nothing to close
      }
    }
    if (this.#ws) {
      const ws = this.#ws;
      this.#ws = null;
      ws.onopen = ws.onmessage = ws.onclose = null; // onerror stays: see #openWS
      try {
        ws.close(1000);
      } catch {
        // already closing
      }
    }
  }

  #clearRetry() {
    clearTimeout(this.#retryTimer);
    this.#retryTimer = null;
  }

  #reconnectNow() {
    this.#attempt = 0;
    this.#gen++;
    this.#connect();
  }

  // #changed applies a subscription change: WebSocket sends it on the open
  // connection; SSE cannot change a stream, so it reconnects with the new
  // set and its cursor.
  #changed({ op, tasks, projects, user }) {
    if (!this.#started) return;
    if (this.#state === State.IDLE || this.#state === State.CLOSED) {
      this.#connect();
      return;
    }
    if (this.#polling) this.#pollNow();
    if (this.#ws && this.#ws.readyState === this.#WebSocket.OPEN && this.#helloSeen) {
      const req = { op, id: ++this.#wsReqID, tasks, projects };
      if (op === 'subscribe' && user) req.scope = 'user';
      if (op === 'unsubscribe' || tasks.length || projects.length || user) this.#send(req);
      return;
    }
    // A new task of a project the stream already carries needs no new
    // stream: it is in the task list of the next connect anyway.
    const covered = op === 'subscribe' && !projects.length && !user &&
      tasks.every((id) => this.#wantProjects.has(this.#tasks.get(id)?.project_id));
    if (this.#es && this.#helloSeen && covered) return;
    if (this.#es || this.#ws) {
      this.#attempt = 0;
      this.#connect();
    } else if (this.#empty()) {
      this.#connect();
    }
  }

  // --- snapshots -------------------------------------------------------------

  #offer(snap, source) {
    if (!snap || typeof snap.task_id !== 'string' || typeof snap.version !== 'number') return;
    this.#stats.received++;
    const prev = this.#tasks.get(snap.task_id);
    if (prev && prev.version >= snap.version) {
      this.#stats.dropped++; // versions only go up
      return;
    }
    if (this.#forgotten.has(snap.task_id) && !this.#inProjects(snap)) return;
    this.#tasks.set(snap.task_id, snap);
    if (isTerminal(snap.status) && this.#wantTasks.delete(snap.task_id) && this.#ws && this.#helloSeen) {
      // Nothing more will come for it: stop watching, so long sessions do
      // not fill the server's per-connection subscription limit.
      this.#send({ op: 'unsubscribe', id: ++this.#wsReqID, tasks: [snap.task_id] });
    }
    this.#emit('task', { task: snap, previous: prev, source });
  }

  #inProjects(snap) {
    return snap.project_id && this.#wantProjects.has(snap.project_id);
  }

  // --- polling ---------------------------------------------------------------

  #startPolling(reason) {
    if (this.#polling) return;
    this.#polling = true;
    this.#setState(State.POLLING, reason);
    this.#pollNow();
  }

  #stopPolling() {
    if (!this.#polling) return;
    this.#polling = false;
    clearTimeout(this.#pollTimer);
    this.#pollTimer = null;
  }

  #pollNow() {
    clearTimeout(this.#pollTimer);
    this.#pollTimer = null;
    this.#pollOnce();
  }

  async #pollOnce() {
    if (!this.#polling || this.#pollBusy) return;
    this.#pollBusy = true;
    let wait = this.#opt.pollIntervalMs;
    try {
      const retryAfter = await this.#pollRound();
      if (retryAfter != null) wait = Math.max(wait, retryAfter);
    } finally {
      this.#pollBusy = false;
    }
    if (this.#polling) this.#pollTimer = setTimeout(() => this.#pollOnce(), wait);
  }

  // #pollRound reads every watched task and project once. It returns a
  // Retry-After in ms when the server asked to slow down.
  async #pollRound() {
    this.#stats.polls++;
    let token;
    try {
      token = await this.#token(false);
    } catch {
      return null;
    }
    const s = this.#subscription();
    const urls = [];
    for (let i = 0; i < s.tasks.length; i += this.#opt.maxIds) {
      const ids = s.tasks.slice(i, i + this.#opt.maxIds);
      // One task has its own URL with an ETag, answered 304 when unchanged.
      urls.push(ids.length === 1
        ? `${this.#base}/v1/tasks/${encodeURIComponent(ids[0])}`
        : `${this.#base}/v1/tasks?ids=${ids.map(encodeURIComponent).join(',')}`);
    }
    for (const p of s.projects) urls.push(`${this.#base}/v1/projects/${encodeURIComponent(p)}/tasks`);
    let retryAfter = null;
    const limits = []; // one announcement per round, the longest wait's
    let denial = null; // one per round too
    await Promise.all(urls.map(async (url) => {
      // Marked a poll: within the user's poll budget it costs the tenant's
      // API limit nothing, so a page that cannot stream does not use up
      // its tenant's plan.
      const headers = { Authorization: `Bearer ${token}`, 'X-Pushd-Poll': '1' };
      const tag = this.#etags.get(url);
      if (tag) headers['If-None-Match'] = tag;
      let res;
      try {
        res = await fetch(url, { headers, cache: 'no-store' });
      } catch {
        return;
      }
      if (res.status === 304) return;
      if (res.status === 429) {
        const ms = parseRetryAfter(res.headers.get('Retry-After'));
        retryAfter = Math.max(retryAfter ?? 0, ms ?? 0);
        limits.push(await limitOfResponse(res, ms));
        return;
      }
      if (DENIALS.has(res.status)) {
        denial ??= await denialOfResponse(res);
        return;
      }
      if (!res.ok) return;
      const tag2 = res.headers.get('ETag');
      if (tag2) this.#etags.set(url, tag2);
      let body;
      try {
        body = await res.json();
      } catch {
        return;
      }
      if (!this.#polling) return;
      if (Array.isArray(body?.tasks)) body.tasks.forEach((t) => this.#offer(t, 'poll'));
      else if (body?.task_id) this.#offer(body, 'poll');
    }));
    if (limits.length) this.#limited(limits.reduce((a, b) => (b.retryAfterMs > a.retryAfterMs ? b : a)), 'poll');
    if (denial && this.#polling) this.#denied(denial);
    return retryAfter;
  }

  // --- plumbing --------------------------------------------------------------

  async #token(refresh) {
    const t = this.#opt.token;
    if (typeof t !== 'function') return t || '';
    if (refresh || this.#tokenValue == null) this.#tokenValue = await t();
    return this.#tokenValue;
  }

  #setState(state, reason = '') {
    if (state === this.#state) return;
    this.#state = state;
    this.#emitState(reason);
  }

  // #emitState fires a state event when what it reports changed since the
  // last one. A hello changes the state, the node and the server's mode at
  // once, and each of those paths asks for an event: a page must see one.
  #emitState(reason = '') {
    const detail = {
      state: this.#state,
      transport: this.#transport,
      serverMode: this.#serverMode,
      serverReason: this.#serverReason,
      node: this.#node,
      reason,
    };
    const key = JSON.stringify([detail.state, detail.transport, detail.serverMode, detail.serverReason, detail.node]);
    if (key === this.#lastState) return;
    this.#lastState = key;
    this.#emit('state', detail);
  }

  #lastState = ''; // what the last state event reported, less its reason

  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}
