/* Whether a page's event stream is still heard from. The API sends a `keepalive` event after
 * each `keepalive_seconds` of quiet (every connection's `state` says how many), so a stream
 * silent for 2.5 of them is not live: the API stopped answering, or a proxy holds the
 * connection, and an EventSource waits on it for ever without an error. It was a comment, which
 * an EventSource never surfaces, and the page kept "live" lit for as long as the API hung. */

// How many keep-alive intervals of silence a live stream may have.
export const QUIET_INTERVALS = 2.5;
// The API's default (ORCH_STREAM_KEEPALIVE_SECONDS), until a stream says its own.
const KEEPALIVE_S = 10;

// `onQuiet(seconds)` is called once the stream was silent too long (`seconds` since it was last
// heard from), and again after as long again while nothing is heard.
export function liveness(onQuiet) {
  let every = KEEPALIVE_S;
  let heardAt = null;
  let timer = null;
  function arm() {
    clearTimeout(timer);
    timer = setTimeout(() => {
      onQuiet(Math.round((Date.now() - heardAt) / 1000));
      arm();
    }, QUIET_INTERVALS * every * 1000);
  }
  return {
    // A stream is opened: watched from now if nothing was heard yet.
    opened() {
      if (heardAt === null) heardAt = Date.now();
      if (timer === null) arm();
    },
    // An event, a keep-alive or the stream's opening; `keepalive` (seconds) when it says it.
    heard(keepalive) {
      if (typeof keepalive === "number" && Number.isFinite(keepalive) && keepalive > 0) every = keepalive;
      heardAt = Date.now();
      arm();
    },
    // Nothing more to hear (the stream ended for good, the page left).
    stop() {
      clearTimeout(timer);
      timer = null;
      heardAt = null;
    },
  };
}
