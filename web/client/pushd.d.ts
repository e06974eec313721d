// Type declarations of pushd.js, the browser client of pushd.

/**
 * A task snapshot as the Task State Service wrote it; unknown fields are kept.
 * Only task_id, tenant_id and version are always present; "" or null in
 * project_id and user_id means none (PROTOCOL.md, "Snapshots and the version rule").
 */
export interface TaskSnapshot {
  task_id: string;
  tenant_id: string;
  project_id?: string | null;
  user_id?: string | null;
  status?: 'QUEUED' | 'RUNNING' | 'PROVIDER_SUBMITTED' | 'POST_PROCESSING' | 'SUCCEEDED' | 'FAILED' | 'CANCELED' | string | null;
  progress?: number;
  stage?: string | null;
  provider?: string | null;
  model?: string | null;
  queue_position?: number | null;
  preview_asset_id?: string | null;
  output_asset_id?: string | null;
  error_code?: string | null;
  /** Only goes up; the client keeps the highest it has seen. */
  version: number;
  /** Unix milliseconds. */
  updated_at?: number | null;
  [field: string]: unknown;
}

export type Transport = 'sse' | 'ws';
export type ClientState = 'idle' | 'connecting' | 'streaming' | 'polling' | 'closed';
export type ServerMode = 'push' | 'polling';

export interface ClientOptions {
  /** The pushd server's base URL; default the page's origin (required outside a browser). */
  url?: string;
  /**
   * Several nodes' base URLs, instead of url: the client starts at one
   * picked at random and moves on to the next after a connection fails or
   * its node drains, resuming with its cursor. A balancer in front of the
   * nodes, passed as url, stays the usual setup.
   */
  urls?: string[];
  /**
   * A token, or a function returning one (called again after a 401 or a
   * token_expired close). A token string the server refuses (401) ends the
   * client: an error event, then the closed state.
   */
  token: string | (() => string | Promise<string>);
  /** Default 'sse'. */
  transport?: Transport;
  tasks?: string[];
  projects?: string[];
  /** Watch every task of the token's user (scope=user). */
  user?: boolean;
  /** Backoff of reconnects: full jitter in [0, min(max, base * 2^attempt)). Defaults 500 and 30000 ms. */
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** A stream without a hello this long after connecting is treated as buffered; default 10000 ms. */
  helloTimeoutMs?: number;
  /** Consecutive failed connections before polling; default 3. */
  fallbackAfter?: number;
  /** Polling interval; default 3000 ms. */
  pollIntervalMs?: number;
  /** While polling, how often streaming is tried again; default 30000 ms. */
  streamRetryMs?: number;
  /** How long a status probe of a failed stream may take; default 5000 ms. */
  probeTimeoutMs?: number;
  /** The server's limit of tasks and projects per connection and per poll request; default 100. */
  maxIds?: number;
  /**
   * Share one connection among the tabs of this origin that have the same
   * url(s) and the same identity (a JWT's claims less iat, exp, nbf and jti;
   * an opaque token as a whole); default false. One tab leads and streams,
   * with its own token and transport, for the union of every tab's
   * subscriptions (within maxIds); the others follow through it. Each tab
   * sees the events an unshared client would, for what it watches; its
   * state is the shared connection's. A tab that closes, crashes or is
   * frozen hands the lead over within about 2 s, resuming with the cursor.
   * Needs BroadcastChannel, Web Locks and crypto.subtle (a secure context:
   * https or localhost): Chrome and Edge 69+, Firefox 96+, Safari 15.4+.
   * Without them, with a token function that fails at start, or with
   * user: true and an opaque token, the client streams by itself.
   */
  share?: boolean;
  /**
   * Ask for deltas; default true. The server then sends a task's later
   * versions as JSON merge patches from the version it last sent, where
   * that is smaller; the client applies them, and every task event still
   * carries the whole snapshot. A patch from a version the client does not
   * hold is not applied: the task is read whole (stats.wholeReads).
   */
  deltas?: boolean;
  /**
   * The WebSocket constructor; default globalThis.WebSocket. Outside a
   * browser, pass one (in Node.js, the ws package's). Needed for transport 'ws'.
   */
  WebSocket?: new (url: string, protocols?: string | string[]) => WebSocket;
  /**
   * The EventSource constructor; default globalThis.EventSource. Outside a
   * browser, pass one (in Node.js, the eventsource package's). Needed for transport 'sse'.
   */
  EventSource?: new (url: string) => EventSource;
}

/**
 * The detail of a `state` event. One fires each time any field but
 * `reason` changes, and only then: a hello that brings the streaming
 * state, the node and the server's mode fires one.
 */
export interface StateDetail {
  state: ClientState;
  transport: Transport;
  /** The server's mode, from hello and mode events; null before the first hello. */
  serverMode: ServerMode | null;
  serverReason: string;
  /** The node that said hello last. */
  node: string;
  /** Why the state changed, when the client knows (such as the reason it fell back to polling). */
  reason: string;
}

export interface TaskDetail {
  task: TaskSnapshot;
  /** The snapshot it replaced, if any. */
  previous?: TaskSnapshot;
  source: 'sse' | 'ws' | 'poll' | 'page';
}

export interface ModeDetail {
  mode: ServerMode;
  reason: string;
}

export interface HelloDetail {
  conn_id: string;
  node: string;
  mode: ServerMode;
  heartbeat_ms: number;
  transport: Transport;
  /** True when this stream ended a stretch of polling. */
  resumed: boolean;
}

export interface ReconnectingDetail {
  delayMs: number;
  /**
   * Why: 'stream_error', 'ws_close_<code>', 'http_<status>', 'no_hello', 'interrupted', 'server_reconnect', 'token',
   * 'sse_error' or 'ws_error' (the EventSource or WebSocket constructor threw),
   * 'rate_limit_exceeded', or 'silent': nothing arrived for heartbeat_ms plus HEARTBEAT_GRACE_MS.
   */
  reason: string;
  attempt: number;
  polling: boolean;
  /** The URL the next attempt goes to: with urls, the next of the list. */
  url: string;
}

/** A refused subscription, a server error message, or a client-side problem. */
export interface ErrorDetail {
  code: string;
  message?: string;
  /**
   * With a refusal that does not pass (a refused token, a foreign origin,
   * a malformed request): its HTTP status, 400, 401 or 403. After a 403 or
   * 400, or a 401 with a token string, the client closes (state 'closed',
   * reason 'http_<status>'); after a 401 with a token function it asks the
   * function for a new token and tries again.
   */
  status?: number;
  task_id?: string;
  project_id?: string;
  /** With rate_limit_exceeded: when to ask again, in whole seconds (rounded up) and in milliseconds. */
  retry_after?: number;
  retry_after_ms?: number;
}

/** The codes of refusals for a limit. */
export type LimitCode = 'rate_limit_exceeded' | 'too_many_connections';

/** A refusal for a limit, as limitOf reads it. */
export interface Limit {
  code: LimitCode;
  /** Whole seconds, rounded up: the server's retry_after (a 429's Retry-After); at most MAX_SERVER_WAIT_MS / 1000. */
  retryAfter: number;
  /** At most MAX_SERVER_WAIT_MS. */
  retryAfterMs: number;
  /** The platform's message: "too many requests, try again in <retryAfter> s". */
  message: string;
}

/**
 * The detail of a `limited` event: something was refused for a limit. The
 * client waits at least retryAfterMs before asking again by itself.
 */
export interface LimitedDetail extends Limit {
  /** What was refused: a connection (a 429, or a refusal in the SSE stream), a poll (429), subscribed ids, or a WebSocket request. */
  source: 'connect' | 'poll' | 'subscribe' | 'request';
}

/**
 * The detail of a `sync` event (SSE from a node with streams): the
 * connection's initial state is complete as of this stream cursor, which
 * the client resumes from next.
 */
export interface SyncDetail {
  cursor: string;
}

export interface ClientStats {
  received: number;
  /** Snapshots dropped because the client held that version or a newer one. */
  dropped: number;
  /**
   * This and the counters below are, with share, the shared connection's
   * as its leader counts them since it took the lead (a follower's lag by
   * up to a ping).
   */
  reconnects: number;
  polls: number;
  fallbacks: number;
  /** Heartbeats the server sent idle connections. */
  heartbeats: number;
  /**
   * Tasks read whole because a patch came from a version the client did
   * not hold (a poll or the page's own read had got ahead of the stream).
   */
  wholeReads: number;
}

/** With options.share: this tab's part in the shared connection. */
export interface SharedDetail {
  /** 'leader': this tab holds the connection; 'follower': it gets events through the leader; null: it streams by itself, or is not started. */
  role: 'leader' | 'follower' | null;
  /** How many tabs share the connection, this one included (1 when alone). */
  tabs: number;
}

export interface PushdEventMap {
  state: CustomEvent<StateDetail>;
  task: CustomEvent<TaskDetail>;
  mode: CustomEvent<ModeDetail>;
  hello: CustomEvent<HelloDetail>;
  reconnecting: CustomEvent<ReconnectingDetail>;
  error: CustomEvent<ErrorDetail>;
  limited: CustomEvent<LimitedDetail>;
  sync: CustomEvent<SyncDetail>;
  /** With options.share: the tab's role or the number of tabs sharing changed. */
  share: CustomEvent<SharedDetail>;
}

export declare const State: {
  readonly IDLE: 'idle';
  readonly CONNECTING: 'connecting';
  readonly STREAMING: 'streaming';
  readonly POLLING: 'polling';
  readonly CLOSED: 'closed';
};

/**
 * Added to the hello's heartbeat_ms: a connection that sends nothing for longer is
 * taken for dead, and the client reconnects, resuming. 10000 ms.
 */
export declare const HEARTBEAT_GRACE_MS: number;
/**
 * The longest wait the client takes from a server (a reconnect hint's after_ms, Retry-After,
 * retry_after_ms, retry_after): a longer one is taken as this long, and one that is not a
 * finite number from 0 up as none. The jitter added to a refusal's wait comes on top. 300000 ms.
 */
export declare const MAX_SERVER_WAIT_MS: number;
/**
 * The longest heartbeat_ms the client takes from a hello: a connection silent for this plus
 * HEARTBEAT_GRACE_MS is taken for dead, whatever heartbeat_ms said. 300000 ms.
 */
export declare const MAX_HEARTBEAT_MS: number;

export declare function isTerminal(status: string): boolean;
export declare function fullJitter(attempt: number, baseMs: number, maxMs: number, random?: () => number): number;
/** The platform's message for a refusal for a limit: "too many requests, try again in <seconds> s". */
export declare function limitMessage(seconds: number): string;
/**
 * Reads a refusal for a limit from a 429 body ({"error", "retry_after", "retry_after_ms"}) or an
 * error event, rejection or message ({"code", ...}); null when the code is not a limit's.
 */
export declare function limitOf(refusal: unknown, fallbackMs?: number | null): Limit | null;
/** A Retry-After header (seconds or an HTTP date) in ms, at most MAX_SERVER_WAIT_MS; null when absent or malformed. */
export declare function parseRetryAfter(value: string | null | undefined, now?: number): number | null;

export declare class PushdClient extends EventTarget {
  constructor(options: ClientOptions);
  readonly state: ClientState;
  readonly transport: Transport;
  readonly serverMode: ServerMode | null;
  readonly node: string;
  /** The URL the client connects and polls to now: one of urls, or url. */
  readonly url: string;
  /** A copy of the newest snapshot of every task held. */
  readonly tasks: Map<string, TaskSnapshot>;
  readonly stats: ClientStats;
  /**
   * With options.share: whether this tab leads the shared connection or
   * follows it, and how many tabs share it. Which tab leads is not for a
   * page to rely on: the lead moves when a tab closes or freezes.
   */
  readonly shared: SharedDetail;
  task(id: string): TaskSnapshot | undefined;
  start(): void;
  /** Closes the connection and stops every timer. With share: ends this tab's subscriptions only; the others keep the connection (another tab leads if this one did). */
  close(): void;
  subscribe(what: { tasks?: string[]; projects?: string[]; user?: boolean }): void;
  unsubscribe(what: { tasks?: string[]; projects?: string[] }): void;
  /** Hands the client a snapshot got elsewhere (e.g. the answer that created the task); kept only if newer. */
  offer(snapshot: TaskSnapshot): void;
  forget(id: string): void;
  /** Switches between 'sse' and 'ws'; reconnects at once when they differ. With share, switches the shared connection. */
  setTransport(transport: Transport): void;
  /** Drops the connection as a network failure would; the client reconnects by its policy. With share, the shared connection. */
  interrupt(): void;

  addEventListener<K extends keyof PushdEventMap>(type: K, listener: (ev: PushdEventMap[K]) => void, options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | AddEventListenerOptions): void;
  removeEventListener<K extends keyof PushdEventMap>(type: K, listener: (ev: PushdEventMap[K]) => void, options?: boolean | EventListenerOptions): void;
  removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | EventListenerOptions): void;
}
