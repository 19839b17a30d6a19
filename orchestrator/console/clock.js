/* Times as the console shows them: in the browser's zone, named, and how far from the server's
 * own clock (sampled from every answer's `Date` header). */
import { el } from "./text.js";

// ---- times: their zone, and the server's clock ---------------------------------------
// A time read `12/6/2026, 5:20:00 PM`, in a zone it did not name, and what is past or ahead
// was judged by the browser's clock, which may be hours adrift: a dispatcher's hold for ten
// more minutes read as run out (Retry offered, the API refusing it), "last hour" listed
// nothing. A time is shown in the browser's zone, named (`2026-12-06 17:20:00 GMT+8`; its
// tooltip in UTC), with how long ago or ahead it is by the server's clock: every API answer's
// `Date` header. That header is whole seconds (uvicorn writes it once a second), read
// before the answer left, so each sample is at most the server's lead on the browser and
// within two seconds of it; the largest of the recent ones is the nearest, and half a
// second is added for the seconds cut off. A few seconds either way read "just now".
const leads = [];
let lead = 0; // ms the server's clock is ahead of the browser's
export function sampleClock(response) {
  const at = Date.parse(response.headers.get("Date") || "");
  if (Number.isNaN(at)) return;
  leads.push(at - Date.now());
  if (leads.length > 10) leads.shift(); // a browser clock set right meanwhile is followed
  lead = Math.max(...leads) + 500;
}
export function now() { return Date.now() + lead; }
const pad = (n, width = 2) => String(n).padStart(width, "0");
export function zoneOf(date, timeZone) {
  try {
    const part = new Intl.DateTimeFormat("en-US", { timeZone, timeZoneName: "short" })
      .formatToParts(date).find((x) => x.type === "timeZoneName");
    return part ? part.value : "local time";
  } catch (_) { return "local time"; }
}
function stamp(date, utc) {
  const [y, mo, d, h, mi, sec] = utc
    ? [date.getUTCFullYear(), date.getUTCMonth(), date.getUTCDate(), date.getUTCHours(), date.getUTCMinutes(), date.getUTCSeconds()]
    : [date.getFullYear(), date.getMonth(), date.getDate(), date.getHours(), date.getMinutes(), date.getSeconds()];
  return `${pad(y, 4)}-${pad(mo + 1)}-${pad(d)} ${pad(h)}:${pad(mi)}:${pad(sec)} ${utc ? "UTC" : zoneOf(date)}`;
}
// "3 min ago", "in 10 min": from the server's now, the larger unit only.
function howFar(date) {
  const ms = date.getTime() - now();
  const s = Math.floor(Math.abs(ms) / 1000);
  if (s < 3) return "just now";
  const size = s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min`
    : s < 48 * 3600 ? `${Math.floor(s / 3600)} h` : `${Math.floor(s / 86400)} d`;
  return ms > 0 ? `in ${size}` : `${size} ago`;
}
export function when(value) {
  if (!value) return "—";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return el("time", { datetime: String(value), title: stamp(date, true) },
    el("span", { class: "stamp" }, stamp(date, false)), " ", el("span", { class: "far" }, `(${howFar(date)})`));
}
// How far each time shown is, kept true as the clock runs (nothing else redraws an idle page).
setInterval(() => {
  for (const far of document.querySelectorAll("time[datetime] > span.far")) {
    const text = `(${howFar(new Date(far.parentElement.getAttribute("datetime")))})`;
    if (far.textContent !== text) far.textContent = text;
  }
}, 5000);
