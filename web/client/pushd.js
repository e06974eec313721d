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
// - Asks for deltas (deltas=merge): the server sends a later version as a
//   JSON merge patch from the version it last sent this connection, where
//   that is smaller, and the client applies it only to that version. A
//   patch from a version the client does not hold is not applied; the
//   task is read whole instead. Task events always carry whole snapshots.
// - Resumes where it left off: SSE passes the last event id from a node
//   with streams (of a task, or of the sync that completes the initial
//   state), else the versions it holds, as last_event_id; WebSocket sends
//   the versions it holds as "since"; the server skips what did not move.
//   It asks for SSE ids that name their own task only (cursor=own), so an
//   event's id stays small however many tasks the stream carries.
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
// - With share: true, lets the tabs of one origin that watch the same
//   server(s) as the same identity hold one connection between them: one
//   tab leads and streams for all, the others follow through it, each
//   seeing only what it asked for. Web Locks elect the leader and a
//   BroadcastChannel carries the rest; the section "sharing one stream
//   between tabs" below says how, and why it survives a closed, crashed
//   or frozen leader. Without both APIs (or crypto.subtle) a client
//   streams by itself.

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
  share: false,
  deltas: true,
};

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

// mergePatch is RFC 7386's MergePatch(target, patch), into a new object:
// the snapshot replaced stays as the page was given it.
function mergePatch(target, patch) {
  if (!isObject(patch)) return patch;
  const out = isObject(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    // A data property, as JSON.parse makes it: "__proto__" too.
    else Object.defineProperty(out, k, { value: mergePatch(Object.hasOwn(out, k) ? out[k] : undefined, v), enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/** Is the status one a task never leaves? */
export function isTerminal(status) {
  return TERMINAL.has(status);
}

// jwtClaims is a JWT's payload, or null for a token that is not a JWT (an
// opaque session token) or whose payload is not a JSON object.
function jwtClaims(token) {
  const parts = typeof token === 'string' ? token.split('.') : [];
  if (parts.length !== 3) return null;
  try {
    const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
    const claims = JSON.parse(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4)));
    return claims !== null && typeof claims === 'object' ? claims : null;
  } catch {
    return null;
  }
}

// jwtExpiry is a JWT's exp in Unix ms, or null for a token that is not a
// JWT (an opaque session token) or has none.
function jwtExpiry(token) {
  const exp = jwtClaims(token)?.exp;
  return typeof exp === 'number' && Number.isFinite(exp * 1000) ? exp * 1000 : null;
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

// ENGINE is the option key with which a share's leader hands the client
// it streams through the snapshots and cursor to resume from; the client
// hands back a reader of its cursor. Not exported: pages cannot use it.
const ENGINE = Symbol('pushd share engine');

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

  #stats = { received: 0, dropped: 0, reconnects: 0, polls: 0, fallbacks: 0, heartbeats: 0, wholeReads: 0 };

  // Sharing (options.share): true from start() until close() unless this
  // tab streams by itself after all; #share is the TabShare once its key
  // is known.
  #sharing = false;
  #share = null;
  #shareStart = 0; // ends a share's start that a close() overtook

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
    // A share's leader streams through a client of its own, seeded with
    // the snapshots and the cursor every tab keeps (TabShare#startEngine).
    const engine = options[ENGINE];
    if (engine) {
      for (const snap of engine.snaps) this.#tasks.set(snap.task_id, snap);
      this.#cursor = engine.cursor;
      engine.cursorOf = () => this.#cursor;
    }
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
  get stats() { return { ...this.#stats, ...this.#share?.stats }; }
  /**
   * With options.share: this tab's role, 'leader' or 'follower', and how
   * many tabs share the connection; role null while the client streams
   * by itself (share off or not possible here) or is not started.
   */
  get shared() { return { role: this.#share?.role ?? null, tabs: this.#share?.tabs ?? 1 }; }

  /** The newest snapshot of a task, or undefined. */
  task(id) { return this.#tasks.get(id); }

  /** Connects (or, with nothing subscribed, waits for a subscription). */
  start() {
    if (this.#started) return;
    this.#started = true;
    if (typeof addEventListener === 'function') addEventListener('online', this.#online);
    if (this.#opt.share && canShare()) {
      this.#startShared();
      return;
    }
    this.#connect();
  }

  /** Closes the connection and stops every timer; the client can be started again. */
  close() { this.#close(''); }

  #close(reason) {
    this.#started = false;
    if (typeof removeEventListener === 'function') removeEventListener('online', this.#online);
    this.#leaveShare();
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
    if (this.#sharing) {
      this.#share?.setTransport(t);
      return;
    }
    if (this.#started) this.#reconnectNow();
  }

  /**
   * Drops the current connection as a network failure would; the client
   * then reconnects by its usual policy. For demos and tests.
   */
  interrupt() {
    if (this.#sharing) {
      this.#share?.interrupt();
      return;
    }
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
    if (this.#opt.deltas) q.set('deltas', 'merge');
    q.set('cursor', 'own');
    const last = cursor ? this.#resumeCursor() : '';
    if (last) q.set('last_event_id', last);
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
    for (const type of ['hello', 'task', 'patch', 'mode', 'sync', 'reconnect', 'error', 'heartbeat']) {
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
    es.addEventListener('patch', (e) => {
      if (gen !== this.#gen) return;
      if (e.lastEventId) this.#cursor = e.lastEventId;
      this.#patch(json(e), 'sse');
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
      if (this.#opt.deltas) u.searchParams.set('deltas', 'merge');
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
        case 'patch': this.#patch(m, 'ws'); break;
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

  // #resumeCursor is the Last-Event-ID an SSE reconnect resumes with. The
  // client asks for ids that name their own event's task only
  // (cursor=own), so an event costs the same bytes however many tasks the
  // connection watches; the client keeps the rest: a stream cursor as the
  // node wrote it, or else the versions it holds of what it watches, within
  // the node's 4096 bytes (tasks watched by id first).
  #resumeCursor() {
    const last = this.#cursor;
    if (!last || last.startsWith('s1.')) return last;
    const s = this.#subscription();
    const pairs = [];
    let size = 0;
    for (const id of [...s.tasks, ...this.#heldIDs(s.tasks)]) {
      const v = this.#tasks.get(id)?.version;
      if (!v) continue;
      const pair = `${id}=${v}`;
      if (size + pair.length + 1 > 4096) break;
      pairs.push(pair);
      size += pair.length + 1;
    }
    return pairs.join(',') || last;
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
    if (this.#sharing) {
      // The want-set goes to the tabs (a share not started yet reads it
      // when it starts). The user scope needs the user's id to tell its
      // tasks from others', which an opaque token does not give.
      if (user && this.#share && this.#share.user == null) this.#streamAlone();
      else this.#share?.changed();
      return;
    }
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

  // #patch applies a merge patch, which the server sends from the version
  // it last sent this connection. Held at that version, the task moves
  // on. Held at another (a poll or the page's own read got ahead, or the
  // client let the task go), the patch is no use: the task is read whole.
  #patch(ev, source) {
    if (!isObject(ev) || typeof ev.task_id !== 'string' || typeof ev.base !== 'number' || !isObject(ev.patch)) return;
    const held = this.#tasks.get(ev.task_id);
    if (held && typeof ev.patch.version === 'number' && held.version >= ev.patch.version) {
      this.#stats.received++;
      this.#stats.dropped++; // versions only go up
      return;
    }
    if (held?.version !== ev.base) {
      this.#stats.wholeReads++;
      this.#readWhole(ev.task_id, source);
      return;
    }
    this.#offer(mergePatch(held, ev.patch), source);
  }

  // #readWhole reads one task, for a patch the client could not apply.
  async #readWhole(id, source) {
    let res;
    try {
      const token = await this.#token(false);
      res = await fetch(`${this.#base}/v1/tasks/${encodeURIComponent(id)}`, { headers: { Authorization: `Bearer ${token}` }, cache: 'no-store' });
    } catch {
      return; // the task's next change, or the next resume, brings it
    }
    if (!res.ok) return;
    try {
      this.#offer(await res.json(), source);
    } catch {
      // not a snapshot: nothing to offer
    }
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

  // --- sharing (the tab's side; TabShare below does the rest) ----------------

  // #startShared joins this tab to the share of its key, which needs the
  // token: a tab that cannot have one, or a digest, streams by itself, as
  // does one that watches the user scope with an opaque token.
  async #startShared() {
    const attempt = ++this.#shareStart;
    this.#sharing = true;
    this.#setState(State.CONNECTING);
    let identity = null;
    try {
      identity = await shareIdentity(this.#bases, await this.#token(false));
    } catch {
      // No token (connecting alone reports why) or no digest.
    }
    if (attempt !== this.#shareStart || !this.#started) return;
    if (!identity || (this.#wantUser && identity.user == null)) {
      this.#sharing = false;
      this.#connect();
      return;
    }
    const user = identity.user;
    this.#share = new TabShare(identity, this.#opt, {
      want: () => this.#subscription(),
      transport: () => this.#transport,
      deliver: (snap, source) => this.#shareWants(snap, user) && this.#offer(snap, source),
      state: (detail) => this.#sharedState(detail),
      emit: (type, detail) => this.#sharedEvent(type, detail, user),
      changed: (detail) => this.#emit('share', detail),
    });
    this.#share.start();
  }

  #leaveShare() {
    this.#shareStart++;
    this.#sharing = false;
    const share = this.#share;
    this.#share = null;
    if (share) {
      share.close();
      this.#emit('share', this.shared);
    }
  }

  // #streamAlone leaves the share and connects by itself.
  #streamAlone() {
    this.#leaveShare();
    this.#connect();
  }

  // #shareWants says whether a snapshot the leader relays is one this tab
  // watches: a task it asked for or holds, of a project it watches, or,
  // with the user scope, of its user (what the server's scope delivers).
  #shareWants(snap, user) {
    const id = snap?.task_id;
    return this.#wantTasks.has(id) || (this.#tasks.has(id) && !this.#forgotten.has(id)) || !!this.#inProjects(snap) ||
      (this.#wantUser && user != null && snap.user_id === user);
  }

  // #sharedState takes the shared connection's state, as its leader
  // reports it, for this tab's.
  #sharedState(d) {
    if (!d || !this.#started) return;
    this.#state = d.state;
    this.#transport = d.transport === 'ws' ? 'ws' : 'sse';
    this.#serverMode = d.serverMode ?? null;
    this.#serverReason = d.serverReason || '';
    this.#node = d.node || '';
    this.#emitState(d.reason || '');
    // The leader's connection was refused for good (a 403, a 400, a 401
    // with a token string): this tab's own would have been too.
    if (d.state === State.CLOSED) this.#close(d.reason || '');
  }

  // #sharedEvent passes on an event of the shared connection; a refusal
  // of a task or project only to the tabs that watch it.
  #sharedEvent(type, d, user) {
    if (type === 'error' && d?.task_id && !this.#shareWants({ task_id: d.task_id }, user)) return;
    if (type === 'error' && d?.project_id && !d?.task_id && !this.#wantProjects.has(d.project_id)) return;
    this.#emit(type, d);
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

// --- sharing one stream between tabs ----------------------------------------
//
// With share: true, the tabs of one origin whose clients have the same key
// hold one connection between them. The key is a SHA-256 of the server
// URL(s) and the identity: a JWT's claims less the ones that change from
// token to token (iat, exp, nbf, jti), or an opaque token itself. Only the
// hex digest names the lock and the channel; a token never leaves its tab.
//
// - Election: the tab granted the Web Lock "pushd:<key>" leads. It streams
//   through a PushdClient of its own (the engine), with its own token, for
//   the union of every tab's want-set, and relays over the BroadcastChannel
//   of the same name every snapshot (with the SSE cursor as of it), state
//   and event the engine has. Every tab, leader included, takes them
//   through the same path: its own version rule and filter.
// - A closed or crashed leader's lock is released by the browser: the next
//   tab queued for it leads at once. A frozen leader keeps it, so followers
//   ask (ping, every SHARE_PING_MS) and the leader answers (pong); a
//   follower that has heard no pong for SHARE_DEAD_MS, and none to a ping
//   of its own sent SHARE_ANSWER_MS ago or more, takes the lock with steal
//   after a random delay (so that not all do; one that hears a new leader
//   meanwhile gives up). The unanswered ping keeps a follower that was
//   itself frozen or throttled (a hidden tab's timers may run once a
//   minute) from taking a live leader's place: it asks first.
// - Why the pong waits for the lock manager: Chromium runs a frozen page's
//   BroadcastChannel handlers, but not its timers, network events or lock
//   manager replies, so a pong sent from the handler would speak for a
//   leader that delivers nothing. The leader answers a ping only once
//   navigator.locks.query() has answered it, which a frozen page does not
//   hear before it thaws; the query also shows a leader whose lock was
//   stolen that it no longer holds it. Neither message handlers nor lock
//   replies are throttled in hidden tabs, so a hidden leader answers at
//   once.
// - Terms: a leader takes one past the highest term it heard (from
//   leaders, and from followers' pings) and tags what it sends with it;
//   tabs ignore an older term's, and a leader that hears of a newer one
//   steps down, as it does when its lock request rejects (stolen): its
//   engine closes, it follows and queues for the lock again.
// - Want-sets: each tab sends its whole want-set (by a random tab id) when
//   it changes, and every tab keeps every tab's latest, so whichever leads
//   next knows the union. A tab holds a presence lock "pushd:<key>:tab:<id>"
//   while it lives; the others wait on it, so a tab that vanished without a
//   word leaves the union when the browser releases its lock.
// - Every tab keeps the newest relayed snapshot of every task some tab
//   wants, and the last cursor: a new leader seeds its engine with them,
//   so it resumes with since (WebSocket) or last_event_id (SSE) as a
//   reconnecting client would, and the version rule of every tab drops
//   what a resume sends again.
// - A tab that joins, or changes its want-set, gets at once from the
//   leader the snapshots it keeps of the tab's tasks, and with a join the
//   shared connection's state and last hello.

const SHARE_PING_MS = 400; // a follower asks the leader this often
const SHARE_DEAD_MS = 1000; // a leader silent this long is taken for frozen...
const SHARE_ANSWER_MS = 500; // ...once a ping of this tab's has had no answer this long
const SHARE_STEAL_MS = 250; // a follower waits up to this long more, at random, before taking the lead

// The events of the leader's connection relayed to every tab besides task
// and state.
const RELAYED = ['hello', 'limited', 'error', 'reconnecting', 'mode', 'sync'];

// canShare says whether this page has what sharing needs: BroadcastChannel,
// Web Locks and crypto.subtle (both of the last in secure contexts only).
function canShare() {
  return typeof BroadcastChannel === 'function' && typeof navigator !== 'undefined' &&
    typeof navigator.locks?.request === 'function' && typeof globalThis.crypto?.subtle?.digest === 'function';
}

const VOLATILE_CLAIMS = new Set(['iat', 'exp', 'nbf', 'jti']);

// canonical is JSON with every object's keys sorted, so equal claims hash
// alike whatever order a token lists them in.
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

// shareIdentity is the key of the tabs that may share with this one, and
// the user a JWT names (its sub; null for an opaque token).
async function shareIdentity(bases, token) {
  if (typeof token !== 'string' || !token) throw new TypeError('pushd: no token to share a stream with');
  const claims = jwtClaims(token);
  let identity = { token };
  if (claims) {
    const stable = {};
    for (const [k, v] of Object.entries(claims)) if (!VOLATILE_CLAIMS.has(k)) stable[k] = v;
    identity = { claims: stable };
  }
  const text = canonical([[...bases].sort(), identity]);
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  const key = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, '0')).join('');
  return { key, user: typeof claims?.sub === 'string' ? claims.sub : null };
}

// matches says whether a want-set ({tasks, projects, user}) covers a
// snapshot; user is the identity's user id.
function matches(want, snap, user) {
  return !!want && (want.tasks?.includes(snap.task_id) || (!!snap.project_id && want.projects?.includes(snap.project_id)) ||
    (!!want.user && user != null && snap.user_id === user));
}

function randomID() {
  const b = new Uint8Array(8);
  crypto.getRandomValues(b);
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
}

// TabShare is one tab's part in a share: a follower, or the leader that
// streams for all. port is its client's side:
//   want()              the tab's want-set, {tasks, projects, user}
//   transport()         the transport the tab would stream over
//   deliver(snap, src)  a relayed snapshot, for the tab's filter and version rule
//   state(detail)       the shared connection's state
//   emit(type, detail)  an event of the shared connection (RELAYED)
//   changed({role, tabs})
class TabShare {
  // Set once.
  #id = randomID();
  #key;
  #options; // the client's, for the engine
  #port;
  #chan = null;
  #closed = false;
  user; // the identity's user id, or null

  // What every tab keeps, so that any can lead next.
  #tabs = new Map(); // tab id -> want-set, of the other tabs alive
  #watching = new Map(); // tab id -> AbortController of the wait on its presence lock
  #store = new Map(); // task id -> { snap, source }: the newest relayed of each task some tab wants
  #cursor = ''; // the SSE cursor relayed with the newest event
  #term = 0; // the highest leader's term heard
  #last = { state: null, hello: null }; // the shared connection's, as relayed
  #connStats = null; // the leader's engine's counters, from its last pong

  // The lead lock.
  #role = null; // 'leader' or 'follower'; null before start and after close
  #grant = null; // the grant this tab leads under
  #release = null; // resolves the grant's callback: releases the lock
  #queued = null; // aborts the lock request this tab queued
  #presence = null; // releases this tab's presence lock

  // Leader only.
  #engine = null;
  #union = ''; // the want-set the engine watches, as JSON
  #asking = false; // a pong waits for the lock manager

  // Follower only.
  #pingTimer = null;
  #stealTimer = null;
  #lastPong = 0; // performance.now() when a leader last answered
  #unanswered = null; // performance.now() of the first ping since, if any

  #announced = '';

  constructor(identity, options, port) {
    this.#key = identity.key;
    this.user = identity.user;
    this.#options = options;
    this.#port = port;
  }

  get role() { return this.#role; }
  get tabs() { return this.#tabs.size + 1; }
  get stats() { return this.#role === 'leader' ? connStats(this.#engine) : this.#connStats; }

  get #name() { return `pushd:${this.#key}`; }
  #tabLock(id) { return `pushd:${this.#key}:tab:${id}`; }

  async start() {
    // Held for the tab's life; waited on by the others.
    const release = await new Promise((resolve) => {
      navigator.locks.request(this.#tabLock(this.#id), () => new Promise((done) => resolve(done))).catch(() => resolve(null));
    });
    this.#presence = release;
    if (this.#closed) {
      release?.();
      return;
    }
    this.#chan = new BroadcastChannel(this.#name);
    this.#chan.onmessage = (e) => this.#receive(e.data);
    this.#follow();
    this.#post({ t: 'want', want: this.#port.want(), join: true });
    this.#queue();
  }

  close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopEngine();
    this.#role = null;
    this.#stopFollowing();
    this.#queued?.abort();
    for (const ctl of this.#watching.values()) ctl.abort();
    this.#watching.clear();
    this.#post({ t: 'bye' });
    this.#chan?.close();
    // The presence lock first: the tab that leads next finds this one gone.
    this.#presence?.();
    this.#release?.();
    this.#release = null;
  }

  // changed tells the tabs of this tab's new want-set.
  changed() {
    const want = this.#port.want();
    this.#post({ t: 'want', want });
    if (this.#role !== 'leader') return; // the leader answers with what it keeps
    this.#applyUnion();
    for (const { snap, source } of this.#store.values()) if (matches(want, snap, this.user)) this.#port.deliver(snap, source);
  }

  setTransport(transport) {
    if (this.#role === 'leader') this.#engine?.setTransport(transport);
    else this.#post({ t: 'transport', transport });
  }

  interrupt() {
    if (this.#role === 'leader') this.#engine?.interrupt();
    else this.#post({ t: 'interrupt' });
  }

  // --- messages ---

  #post(m) {
    try {
      this.#chan?.postMessage({ ...m, from: this.#id });
    } catch {
      // Closed: this tab is leaving.
    }
  }

  // #broadcast sends what the leader's engine has to every tab, this one
  // included.
  #broadcast(m) {
    this.#post(m);
    this.#receive({ ...m, from: this.#id });
  }

  #receive(m) {
    if (this.#closed || !m || typeof m !== 'object' || typeof m.from !== 'string') return;
    if (typeof m.term === 'number') {
      if (m.term < this.#term) return; // a leader that was replaced (a thawed tab)
      if (m.term > this.#term) {
        this.#term = m.term;
        if (this.#role === 'leader' && m.from !== this.#id) this.#stepDown();
      }
      // A pong waited for the leader's lock manager, and a new leader took
      // the lock: either says a leader lives. (A frozen leader's message
      // handler may still send the rest.)
      if (m.from !== this.#id && (m.t === 'pong' || m.t === 'lead')) this.#alive();
    }
    // A ping says the highest term its follower heard: a tab that joined
    // while the leader was frozen learns it before it may take the lead,
    // and a replaced leader learns it was.
    if (m.t === 'ping' && typeof m.seen === 'number' && m.seen > this.#term) {
      this.#term = m.seen;
      if (this.#role === 'leader') this.#stepDown();
    }
    switch (m.t) {
      case 'ping':
        if (this.#role === 'leader') this.#pong();
        break;
      case 'pong':
        this.#connStats = m.stats ?? null;
        break;
      case 'lead':
        // Make sure the new leader knows this tab's want-set.
        if (m.from !== this.#id) this.#post({ t: 'want', want: this.#port.want() });
        break;
      case 'want':
        this.#tabWants(m.from, m.want, !!m.join);
        break;
      case 'bye':
        this.#forgetTab(m.from);
        break;
      case 'snap':
        this.#keep(m.snap, m.source);
        if (typeof m.cursor === 'string') this.#cursor = m.cursor;
        this.#port.deliver(m.snap, m.source);
        break;
      case 'held':
        this.#held(m);
        break;
      case 'state':
        this.#last.state = m.detail;
        this.#port.state(m.detail);
        break;
      case 'event':
        if (!RELAYED.includes(m.type)) break;
        if (m.type === 'hello') this.#last.hello = m.detail;
        this.#port.emit(m.type, m.detail);
        break;
      case 'transport':
        if (this.#role === 'leader' && (m.transport === 'sse' || m.transport === 'ws')) this.#engine?.setTransport(m.transport);
        break;
      case 'interrupt':
        if (this.#role === 'leader') this.#engine?.interrupt();
        break;
    }
    this.#announce();
  }

  // #keep keeps a relayed snapshot if it is newer than the one kept.
  #keep(snap, source) {
    if (!snap || typeof snap.task_id !== 'string' || typeof snap.version !== 'number') return;
    const kept = this.#store.get(snap.task_id);
    if (!kept || kept.snap.version < snap.version) this.#store.set(snap.task_id, { snap, source });
  }

  // #tabWants notes a tab's want-set; the leader applies the union and
  // answers a tab that joined or changed with what it keeps of its tasks.
  #tabWants(from, want, join) {
    if (from === this.#id || !want || typeof want !== 'object') return;
    const changed = JSON.stringify(this.#tabs.get(from)) !== JSON.stringify(want);
    this.#tabs.set(from, want);
    this.#watch(from);
    if (this.#role !== 'leader' || !(join || changed)) return;
    this.#applyUnion();
    const snaps = [...this.#store.values()].filter(({ snap }) => matches(want, snap, this.user));
    const tabs = Object.fromEntries(this.#tabs);
    tabs[this.#id] = this.#port.want();
    this.#post({
      t: 'held', term: this.#term, to: from, snaps, cursor: this.#cursor, tabs,
      state: this.#last.state, hello: join ? this.#last.hello : null,
    });
  }

  #held(m) {
    for (const { snap, source } of m.snaps || []) this.#keep(snap, source);
    if (typeof m.cursor === 'string') this.#cursor = m.cursor;
    if (m.to !== this.#id) return;
    for (const [id, want] of Object.entries(m.tabs || {})) {
      if (id === this.#id || this.#tabs.has(id)) continue;
      this.#tabs.set(id, want);
      this.#watch(id);
    }
    if (m.state) this.#port.state(m.state);
    if (m.hello) this.#port.emit('hello', m.hello);
    for (const { snap, source } of m.snaps || []) this.#port.deliver(snap, source);
  }

  // #watch waits on a tab's presence lock, which the browser releases
  // when the tab closes or crashes.
  #watch(id) {
    if (this.#watching.has(id) || this.#closed) return;
    const ctl = new AbortController();
    this.#watching.set(id, ctl);
    navigator.locks.request(this.#tabLock(id), { signal: ctl.signal }, () => {
      if (this.#watching.get(id) === ctl) this.#forgetTab(id);
    }).catch(() => {});
  }

  #forgetTab(id) {
    this.#watching.get(id)?.abort();
    this.#watching.delete(id);
    if (!this.#tabs.delete(id)) return;
    // What no tab wants any more need not be kept.
    const wants = [this.#port.want(), ...this.#tabs.values()];
    for (const [task, { snap }] of this.#store) if (!wants.some((w) => matches(w, snap, this.user))) this.#store.delete(task);
    if (this.#role === 'leader') this.#applyUnion();
    this.#announce();
  }

  #announce() {
    const detail = { role: this.#role, tabs: this.tabs };
    const key = `${detail.role} ${detail.tabs}`;
    if (key === this.#announced || this.#closed) return;
    this.#announced = key;
    this.#port.changed(detail);
  }

  // --- the lead lock ---

  // #queue waits in line for the lead lock.
  #queue() {
    if (this.#closed) return;
    const ctl = new AbortController();
    this.#queued = ctl;
    const grant = {};
    navigator.locks.request(this.#name, { signal: ctl.signal }, () => this.#lead(grant)).catch(() => this.#lost(grant));
  }

  // #steal takes the lead lock from a leader that does not answer.
  #steal() {
    this.#queued?.abort();
    this.#queued = null;
    const grant = {};
    navigator.locks.request(this.#name, { steal: true }, () => this.#lead(grant)).catch(() => this.#lost(grant));
  }

  // #lost: the request of grant rejected, aborted while queued or, when
  // this tab led under it, stolen.
  #lost(grant) {
    if (grant === this.#grant) this.#stepDown();
  }

  // #lead runs when the lock is granted; the lock is held until the
  // promise it returns resolves.
  #lead(grant) {
    if (this.#closed) return undefined;
    const before = this.#release;
    this.#grant = grant;
    const held = new Promise((resolve) => { this.#release = resolve; });
    before?.(); // an earlier grant of this tab's, stolen by this one
    if (this.#role !== 'leader') this.#becomeLeader();
    return held;
  }

  async #becomeLeader() {
    this.#role = 'leader';
    this.#stopFollowing();
    const term = ++this.#term;
    this.#post({ t: 'lead', term });
    this.#announce();
    // A tab that closed or crashed with the last leader leaves the union
    // before the engine connects.
    try {
      const { held = [] } = await navigator.locks.query();
      const alive = new Set(held.map((l) => l.name));
      for (const id of [...this.#tabs.keys()]) if (!alive.has(this.#tabLock(id))) this.#forgetTab(id);
    } catch {
      // The watches on presence locks find them.
    }
    if (this.#role === 'leader' && this.#term === term && !this.#closed && !this.#engine) this.#startEngine();
  }

  #stepDown() {
    if (this.#role !== 'leader') return;
    this.#stopEngine();
    this.#grant = null;
    const release = this.#release;
    this.#release = null;
    release?.();
    this.#follow();
    this.#queue();
    // What the new leader relayed while this tab did not hear it.
    this.#post({ t: 'want', want: this.#port.want(), join: true });
    this.#announce();
  }

  // #pong answers pings once the lock manager answers (see above); one
  // pong answers every ping that came meanwhile.
  #pong() {
    if (this.#asking) return;
    this.#asking = true;
    const term = this.#term;
    navigator.locks.query().then(({ held = [] }) => {
      this.#asking = false;
      if (this.#role !== 'leader' || this.#term !== term || this.#closed) return;
      const me = held.find((l) => l.name === this.#tabLock(this.#id))?.clientId;
      const lead = held.find((l) => l.name === this.#name)?.clientId;
      if (me && lead !== me) return; // stolen: the rejection is on its way
      this.#post({ t: 'pong', term, stats: connStats(this.#engine) });
    }, () => {
      this.#asking = false;
    });
  }

  // --- the follower's watch on the leader ---

  #follow() {
    this.#role = 'follower';
    this.#alive();
    this.#ping();
  }

  #stopFollowing() {
    clearTimeout(this.#pingTimer);
    clearTimeout(this.#stealTimer);
    this.#pingTimer = this.#stealTimer = null;
  }

  #ping() {
    clearTimeout(this.#pingTimer);
    this.#pingTimer = null;
    if (this.#role !== 'follower' || this.#closed) return;
    this.#post({ t: 'ping', seen: this.#term });
    const now = performance.now();
    this.#unanswered ??= now;
    if (!this.#stealTimer) {
      // When the leader will have been silent long enough, unless it
      // answers first (#alive), plus the random delay.
      const due = Math.max(this.#lastPong + SHARE_DEAD_MS, this.#unanswered + SHARE_ANSWER_MS);
      this.#stealTimer = setTimeout(() => {
        this.#stealTimer = null;
        if (this.#role === 'follower' && !this.#closed && this.#silent(performance.now())) this.#steal();
      }, Math.max(0, due - now) + SHARE_PING_MS / 8 + Math.random() * SHARE_STEAL_MS);
    }
    this.#pingTimer = setTimeout(() => this.#ping(), SHARE_PING_MS);
  }

  // #silent: no leader answered for SHARE_DEAD_MS, nor a ping out for
  // SHARE_ANSWER_MS.
  #silent(now) {
    return now - this.#lastPong >= SHARE_DEAD_MS && this.#unanswered != null && now - this.#unanswered >= SHARE_ANSWER_MS;
  }

  // #alive notes that a leader answered.
  #alive() {
    this.#lastPong = performance.now();
    this.#unanswered = null;
    clearTimeout(this.#stealTimer);
    this.#stealTimer = null;
  }

  // --- the leader's engine ---

  // #union is every tab's want-set in one, within maxIds: the projects
  // first, as a client's own subscription has them.
  #computeUnion() {
    const tasks = new Set();
    const projects = new Set();
    let user = false;
    for (const w of [this.#port.want(), ...this.#tabs.values()]) {
      for (const id of w.tasks || []) tasks.add(id);
      for (const id of w.projects || []) projects.add(id);
      user ||= !!w.user;
    }
    const max = this.#options.maxIds;
    const p = [...projects].sort().slice(0, max);
    return { tasks: [...tasks].sort().slice(0, Math.max(0, max - p.length)), projects: p, user };
  }

  #startEngine() {
    const u = this.#computeUnion();
    this.#union = JSON.stringify(u);
    const hooks = {
      snaps: [...this.#store.values()].map(({ snap }) => snap).filter((snap) => matches(u, snap, this.user)),
      cursor: this.#cursor,
    };
    const engine = new PushdClient({
      ...this.#options, share: false, transport: this.#port.transport(),
      tasks: u.tasks, projects: u.projects, user: u.user, [ENGINE]: hooks,
    });
    this.#engine = engine;
    const term = this.#term;
    const mine = () => this.#engine === engine && this.#role === 'leader';
    engine.addEventListener('task', (e) => {
      if (!mine() || e.detail.source === 'page') return;
      this.#broadcast({ t: 'snap', term, snap: e.detail.task, source: e.detail.source, cursor: hooks.cursorOf() });
    });
    engine.addEventListener('state', (e) => mine() && this.#broadcast({ t: 'state', term, detail: e.detail }));
    for (const type of RELAYED) {
      engine.addEventListener(type, (e) => mine() && this.#broadcast({ t: 'event', term, type, detail: e.detail }));
    }
    engine.start();
  }

  #stopEngine() {
    const engine = this.#engine;
    this.#engine = null;
    this.#union = '';
    engine?.close();
  }

  // #applyUnion brings the engine's subscription to the union: WebSocket
  // sends the difference, SSE reconnects with its cursor.
  #applyUnion() {
    const engine = this.#engine;
    if (this.#role !== 'leader' || !engine) return;
    const u = this.#computeUnion();
    const key = JSON.stringify(u);
    if (key === this.#union) return;
    const was = JSON.parse(this.#union);
    if (was.user && !u.user) {
      // No request drops the user scope: a new engine, resuming.
      this.#stopEngine();
      this.#startEngine();
      return;
    }
    this.#union = key;
    const minus = (a, b) => a.filter((x) => !b.includes(x));
    // Tasks held for a project or the user scope the union lost go too.
    const stale = [...this.#store.values()].map(({ snap }) => snap)
      .filter((snap) => matches(was, snap, this.user) && !matches(u, snap, this.user)).map((snap) => snap.task_id);
    const lostTasks = [...new Set([...minus(was.tasks, u.tasks), ...stale])];
    const lostProjects = minus(was.projects, u.projects);
    const newTasks = minus(u.tasks, was.tasks);
    const newProjects = minus(u.projects, was.projects);
    if (lostTasks.length || lostProjects.length) engine.unsubscribe({ tasks: lostTasks, projects: lostProjects });
    if (newTasks.length || newProjects.length || (u.user && !was.user)) engine.subscribe({ tasks: newTasks, projects: newProjects, user: u.user });
  }
}

// connStats are the counters of the shared connection: the leader's engine's.
function connStats(engine) {
  if (!engine) return null;
  const { reconnects, polls, fallbacks, heartbeats, wholeReads } = engine.stats;
  return { reconnects, polls, fallbacks, heartbeats, wholeReads };
}
