/* The console's text and elements: everything the model or an operator wrote is put into the
 * page as text nodes, never as HTML (`el`, `append`, `fill`), with each bidirectional control
 * and zero-width character drawn as a visible marker (`shown` for attributes and SVG text). */

// ---- untrusted text: what would reorder or hide it is shown ---------------------------
// A bidirectional control makes text read otherwise than it is ("Trojan Source"): after a
// right-to-left override, "abc\u202Edcba" is drawn "abcabcd". Isolating the string
// (unicode-bidi: isolate, <bdi>) keeps it from its neighbours but not from itself, so every
// such character (the Bidi_Control set, the zero-width and invisible format characters, the
// invisible tag characters) becomes a marker, ⟦U+202E⟧, in a style of its own and named in
// its tooltip. Copying the text copies the marker, not the control; the API and the CLI
// still give the text as stored.
const HIDDEN = /[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]|\udb40[\udc00-\udc7f]/g;
const HIDDEN_NAMES = {
  0x061c: "ARABIC LETTER MARK", 0x200b: "ZERO WIDTH SPACE", 0x200c: "ZERO WIDTH NON-JOINER",
  0x200d: "ZERO WIDTH JOINER", 0x200e: "LEFT-TO-RIGHT MARK", 0x200f: "RIGHT-TO-LEFT MARK",
  0x202a: "LEFT-TO-RIGHT EMBEDDING", 0x202b: "RIGHT-TO-LEFT EMBEDDING",
  0x202c: "POP DIRECTIONAL FORMATTING", 0x202d: "LEFT-TO-RIGHT OVERRIDE",
  0x202e: "RIGHT-TO-LEFT OVERRIDE", 0x2060: "WORD JOINER", 0x2061: "FUNCTION APPLICATION",
  0x2062: "INVISIBLE TIMES", 0x2063: "INVISIBLE SEPARATOR", 0x2064: "INVISIBLE PLUS",
  0x2066: "LEFT-TO-RIGHT ISOLATE", 0x2067: "RIGHT-TO-LEFT ISOLATE", 0x2068: "FIRST STRONG ISOLATE",
  0x2069: "POP DIRECTIONAL ISOLATE", 0xfeff: "ZERO WIDTH NO-BREAK SPACE",
};
// Elements whose content is text only: the marker goes in without its style.
const TEXT_ONLY = new Set(["option", "textarea", "title"]);
function codePoint(char) {
  return `U+${char.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`;
}
function marker(char) { return `\u27e6${codePoint(char)}\u27e7`; } // ⟦U+202E⟧
export function shown(text) {
  // `text` with each hidden character as its marker: for attributes and SVG text.
  return String(text).replace(HIDDEN, marker);
}
function textNodes(text) {
  // A text node, or the text's pieces around a styled marker for each hidden character.
  // `search`, not `test`: a global pattern's `test` moves its lastIndex, where matchAll starts.
  if (text.search(HIDDEN) < 0) return document.createTextNode(text);
  const pieces = document.createDocumentFragment();
  let from = 0;
  for (const match of text.matchAll(HIDDEN)) {
    if (match.index > from) pieces.appendChild(document.createTextNode(text.slice(from, match.index)));
    const char = match[0];
    const name = HIDDEN_NAMES[char.codePointAt(0)] || "TAG CHARACTER";
    pieces.appendChild(el("span", { class: "control-char",
      title: `${codePoint(char)} ${name}: an invisible character in the text, shown here` }, marker(char)));
    from = match.index + char.length;
  }
  if (from < text.length) pieces.appendChild(document.createTextNode(text.slice(from)));
  return pieces;
}

// ---- DOM helpers: text only ------------------------------------------------------------
// Attributes a person reads (tooltips, labels) show hidden characters too; the others
// (ids, values sent back to the API) are data and are kept as they are.
const READ_ATTRIBUTES = new Set(["title", "aria-label", "placeholder", "alt"]);
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "text") {
      fill(node, value);
    } else {
      const text = value === true ? "" : String(value);
      node.setAttribute(key, READ_ATTRIBUTES.has(key) ? shown(text) : text);
    }
  }
  append(node, children);
  return node;
}
export function append(node, children) {
  const textOnly = TEXT_ONLY.has(node.localName);
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child
      : textOnly ? document.createTextNode(shown(child)) : textNodes(String(child)));
  }
  return node;
}
export function fill(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}
export function badge(status, markOpen) {
  // Receipts mark `unknown` and `pending`: a write whose effect nobody has confirmed.
  const marked = Boolean(markOpen) && (status === "unknown" || status === "pending");
  return el("span", { class: `badge s-${status}${marked ? " marked" : ""}` },
    marked ? `⚠ ${status}` : String(status));
}
