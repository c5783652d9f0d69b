// The playground's page: a Slack channel drawn from the Slack Web API emulator's state.
//
// The server owns everything: the page fetches GET /api/state for the chosen user, draws it, and fetches it
// again on every `change` event of GET /api/events. What a person does (a message, a /mm command, a button
// click, opening the App Home) is a POST; its effects come back as change events like everyone else's.
//
// Rendering never goes through innerHTML: every piece of text from the state becomes a text node, so a
// message cannot inject markup whatever it holds. Re-rendering keeps the DOM nodes of messages that did not
// change, so a streamed answer redraws one message and the reader's selection elsewhere survives.

"use strict";

const USER_KEY = "mm-playground-user";
// Consecutive messages of one author within this many seconds share one header, as in Slack.
const GROUP_SECONDS = 5 * 60;
// How close to the bottom (in pixels) still counts as "at the bottom" for auto-scrolling.
const BOTTOM_SLACK = 40;
const RECONNECT_MS = 3000;

const app = {
  state: null, // the last answer of /api/state
  user: localStorage.getItem(USER_KEY), // the chosen user id (null until known)
  userConfirmed: false, // the server answered for app.user at least once
  usersByTeam: {}, // with several workspaces: the person last chosen in each, by team id
  view: "channel", // "channel" or "home"
  thread: null, // ts of the open thread
  renderedThread: null, // the thread the pane showed at the last render (to scroll a newly opened one)
  pending: new Set(), // buttons whose POST has not answered yet (kept disabled across re-renders)
  fetching: false,
  fetchAgain: false,
};

// Signatures of rendered nodes: a node is rebuilt only when its signature changes.
const signatures = new WeakMap();

// ---------------------------------------------------------------------------------------------------------
// DOM helpers

const $ = (selector) => document.querySelector(selector);

/** h("div", {class: "x", text: "y", onclick}, child, [children]) — children may be nodes, strings, arrays. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  appendAll(el, children);
  return el;
}

function appendAll(parent, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) appendAll(parent, child);
    else if (child instanceof Node) parent.append(child);
    else parent.append(document.createTextNode(String(child)));
  }
  return parent;
}

function fragment(...children) {
  return appendAll(document.createDocumentFragment(), children);
}

// ---------------------------------------------------------------------------------------------------------
// The server

/** A JSON request; its answer, or an Error whose message is the server's sentence. */
async function api(method, path, body) {
  let response;
  try {
    response = await fetch(path, {
      method,
      // The server refuses anything but JSON: that is what keeps other sites' forms out.
      headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new Error(`The playground server does not answer (${e.message}).`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    // An answer that is not JSON: reported by its status below.
  }
  if (!response.ok || (data && data.ok === false)) {
    const sentence = data && typeof data.error === "string" ? data.error : null;
    throw new Error(sentence || `${method} ${path} failed (HTTP ${response.status}).`);
  }
  return data;
}

/** Fetch the state now, or right after the fetch under way: change events may come faster than answers. */
async function requestState() {
  if (app.fetching) {
    app.fetchAgain = true;
    return;
  }
  app.fetching = true;
  try {
    do {
      app.fetchAgain = false;
      await fetchState();
    } while (app.fetchAgain);
  } finally {
    app.fetching = false;
  }
}

async function fetchState() {
  const user = app.user;
  const query = user ? `?user=${encodeURIComponent(user)}` : "";
  let state;
  try {
    state = await api("GET", `/api/state${query}`);
  } catch (e) {
    if (user && !app.userConfirmed) {
      // A user remembered from another run of the playground may not exist any more: let the server choose.
      forgetUser();
      app.fetchAgain = true;
      return;
    }
    showError(e.message);
    return;
  }
  if (user !== app.user) {
    app.fetchAgain = true; // the person switched users meanwhile: this answer is someone else's view
    return;
  }
  if (!app.user || !(state.users || []).some((u) => u.id === app.user)) setUser(state.me, false);
  app.userConfirmed = true;
  app.state = state;
  render();
}

function setUser(id, remember) {
  app.user = id || null;
  if (remember && id) localStorage.setItem(USER_KEY, id);
}

function forgetUser() {
  app.user = null;
  localStorage.removeItem(USER_KEY);
}

/** Server-Sent Events: each `change` means "fetch the state again". EventSource reconnects by itself. */
function connectEvents() {
  const source = new EventSource("/api/events");
  source.addEventListener("change", (event) => {
    let version = null;
    try {
      version = JSON.parse(event.data).version;
    } catch {
      // No version: fetch anyway.
    }
    if (version !== null && app.state && version === app.state.version && app.state.me === app.user) return;
    requestState();
  });
  source.addEventListener("open", () => {
    setReconnecting(false);
    requestState(); // whatever changed while the stream was down
  });
  source.addEventListener("error", () => {
    setReconnecting(true);
    if (source.readyState === EventSource.CLOSED) {
      // The server answered with something other than a stream: EventSource gives up, so we start again.
      source.close();
      setTimeout(connectEvents, RECONNECT_MS);
    }
  });
}

function setReconnecting(on) {
  $("#reconnecting").hidden = !on;
}

// ---------------------------------------------------------------------------------------------------------
// Errors

function showError(sentence) {
  $("#error-text").textContent = sentence;
  $("#error").hidden = false;
}

function hideError() {
  $("#error").hidden = true;
}

// ---------------------------------------------------------------------------------------------------------
// People, times, identities

function me() {
  return app.user || (app.state && app.state.me);
}

function isBot(message) {
  const bot = app.state.bot || {};
  return Boolean(message.bot_id) || (bot.id && message.user === bot.id);
}

function userById(id) {
  return (app.state.users || []).find((u) => u.id === id) || null;
}

/** The name a mention shows: the user's handle, the bot's name, else the id. */
function mentionName(id) {
  const bot = app.state.bot || {};
  if (id && id === bot.id) return bot.name || "bot";
  const user = userById(id);
  return user ? user.name || user.real_name || id : id;
}

/** The name a message header shows. */
function displayName(message) {
  if (isBot(message)) return (app.state.bot && app.state.bot.name) || message.username || "bot";
  const user = userById(message.user);
  return user ? user.real_name || user.name : message.user || "someone";
}

function channelName(id) {
  const channel = app.state.channel || {};
  return id === channel.id ? channel.name : id;
}

const AVATAR_COLOURS = ["#e8912d", "#2bac76", "#1264a3", "#e01e5a", "#36c5f0", "#9b59b6", "#ecb22e", "#4a154b"];

function avatarColour(id) {
  let hash = 0;
  for (const ch of String(id)) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
  return AVATAR_COLOURS[hash % AVATAR_COLOURS.length];
}

function avatar(message, small) {
  const cls = small ? "avatar small" : "avatar";
  if (isBot(message)) return h("div", { class: `${cls} bot-avatar`, "aria-hidden": "true" }, "mm");
  const name = displayName(message);
  const el = h("div", { class: cls, "aria-hidden": "true" }, [...name][0].toUpperCase());
  el.style.background = avatarColour(message.user);
  return el;
}

/** Slack timestamps are "seconds.micros" strings: compared as such, never as floats. */
function compareTs(a, b) {
  const [as, af = ""] = String(a).split(".");
  const [bs, bf = ""] = String(b).split(".");
  return Number(as) - Number(bs) || af.padEnd(6, "0").localeCompare(bf.padEnd(6, "0"));
}

function tsDate(ts) {
  return new Date(Number(String(ts).split(".")[0]) * 1000);
}

function pad(n) {
  return String(n).padStart(2, "0");
}

function clock(date) {
  return `${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

function sameDay(a, b) {
  return a.toDateString() === b.toDateString();
}

function dayLabel(date) {
  const today = new Date();
  const yesterday = new Date(today.getTime() - 86400000);
  if (sameDay(date, today)) return "Today";
  if (sameDay(date, yesterday)) return "Yesterday";
  return date.toLocaleDateString("en-US", { weekday: "long", month: "long", day: "numeric" });
}

/** Slack's <!date^…> tokens, in the reader's time zone (what Slack does), 24-hour clock like the headers. */
function formatSlackDate(seconds, format, fallback) {
  const date = new Date(seconds * 1000);
  if (Number.isNaN(date.getTime())) return fallback || "";
  const month = (style) => date.toLocaleDateString("en-US", { month: style });
  const pretty = (long) => {
    const label = dayLabel(date);
    if (label === "Today" || label === "Yesterday") return label.toLowerCase();
    return long ? `${month("long")} ${date.getDate()}, ${date.getFullYear()}` : `${month("short")} ${date.getDate()}`;
  };
  const tokens = {
    date_num: `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`,
    date: `${month("long")} ${date.getDate()}, ${date.getFullYear()}`,
    date_short: `${month("short")} ${date.getDate()}, ${date.getFullYear()}`,
    date_long: date.toLocaleDateString("en-US", { weekday: "long", month: "long", day: "numeric", year: "numeric" }),
    date_pretty: pretty(true),
    date_short_pretty: pretty(false),
    date_long_pretty: pretty(true),
    time: clock(date),
    time_secs: `${clock(date)}:${pad(date.getSeconds())}`,
  };
  let unknown = false;
  const text = format.replace(/\{(\w+)\}/g, (whole, name) => {
    if (name in tokens) return tokens[name];
    unknown = true;
    return whole;
  });
  return unknown && fallback ? fallback : text;
}

function formatSize(bytes) {
  if (typeof bytes !== "number" || !Number.isFinite(bytes)) return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

/** Only http(s) URLs become links or images; anything else (javascript:, data:…) stays text. */
function safeUrl(raw) {
  try {
    const url = new URL(String(raw), window.location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

function link(url, children) {
  const thread = permalinkThread(url);
  if (thread) {
    // A permalink the bot made (App Home's "In a thread of #…") points at Slack; here the thread is on this page.
    return h("a", { href: url, onclick: (event) => { event.preventDefault(); openChannel(); openThread(thread, false); } }, children);
  }
  return h("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, children);
}

/** The thread a Slack permalink to this channel names ("…/archives/C…/p1700000000123456"), else null. */
function permalinkThread(url) {
  const channel = app.state && app.state.channel && app.state.channel.id;
  const m = /\/archives\/([A-Z0-9]+)\/p(\d{10})(\d{6})(?:\?thread_ts=(\d+\.\d+))?/.exec(url);
  if (!m || m[1] !== channel) return null;
  return m[4] || `${m[2]}.${m[3]}`;
}

// ---------------------------------------------------------------------------------------------------------
// Emoji: a handful of shortcodes the bot and people use, drawn as characters; others stay as written.

const EMOJI = {
  white_check_mark: "✅", heavy_check_mark: "✔️", x: "❌", hourglass_flowing_sand: "⏳", hourglass: "⌛",
  stop_button: "⏹️", pause_button: "⏸️", warning: "⚠️", no_entry_sign: "🚫", rocket: "🚀", tada: "🎉",
  eyes: "👀", "+1": "👍", thumbsup: "👍", "-1": "👎", wave: "👋", smile: "😄", slightly_smiling_face: "🙂",
  thinking_face: "🤔", robot_face: "🤖", memo: "📝", hammer_and_wrench: "🛠️", wrench: "🔧", gear: "⚙️",
  zap: "⚡", package: "📦", closed_lock_with_key: "🔐", lock: "🔒", bulb: "💡", fire: "🔥", bug: "🐛",
  sparkles: "✨", heart: "❤️", point_right: "👉", sleeping: "😴", runner: "🏃", arrows_counterclockwise: "🔄",
};

function emojify(text) {
  return text.replace(/:([a-z0-9_+-]+):/g, (whole, name) => EMOJI[name] || whole);
}

// ---------------------------------------------------------------------------------------------------------
// mrkdwn (Slack's text format), and the Markdown that streamed answers and markdown blocks use.
//
// 1. `<…>` sequences (mentions, channels, links, dates) are cut out first and replaced by placeholder
//    characters, so that no formatting rule can split them and a link's label is rendered on its own.
// 2. ``` fences become code blocks; the rest is cut into lines (quotes, and in Markdown headings and lists).
// 3. Within a line: `code`, then *bold*, _italic_, ~strike~ (and in Markdown **bold**, [label](url), URLs).
// 4. Text nodes decode &amp; &lt; &gt; exactly once: Slack's text holds those for literal & < >.

const PUA_FIRST = 0xe000;
const PUA_LAST = 0xf8ff;
const isPlaceholder = (code) => code >= PUA_FIRST && code <= PUA_LAST;

function decodeEntities(text) {
  return text.replace(/&(amp|lt|gt);/g, (_, name) => ({ amp: "&", lt: "<", gt: ">" })[name]);
}

/** Where the `<` at `start` closes, counting nested `<…>` (a link label may hold a channel); -1 if never. */
function closingBracket(text, start) {
  let depth = 0;
  for (let i = start; i < text.length; i++) {
    const ch = text[i];
    if (ch === "\n") return -1;
    if (ch === "<") depth++;
    else if (ch === ">" && --depth === 0) return i;
  }
  return -1;
}

/** What a `<…>` sequence's inside means, or null when it is not one Slack knows (then it stays text). */
function parseSpecial(inner) {
  const bar = inner.indexOf("|");
  const target = bar < 0 ? inner : inner.slice(0, bar);
  const label = bar < 0 ? null : inner.slice(bar + 1);
  let m;
  if ((m = /^@([A-Za-z0-9_]+)$/.exec(target))) return { kind: "user", id: m[1], label };
  if ((m = /^#([A-Za-z0-9_]+)$/.exec(target))) return { kind: "channel", id: m[1], label };
  if ((m = /^!(here|channel|everyone)$/.exec(target))) return { kind: "broadcast", name: m[1] };
  if ((m = /^!subteam\^([A-Za-z0-9_]+)$/.exec(target))) return { kind: "group", id: m[1], label };
  if ((m = /^!date\^(\d+)\^([^^]*)(?:\^.*)?$/.exec(target))) {
    return { kind: "date", seconds: Number(m[1]), format: m[2], fallback: label };
  }
  if (/^https?:\/\/\S+$/i.test(target)) return { kind: "link", url: target, label };
  if (/^mailto:\S+$/i.test(target)) return { kind: "mailto", url: target, label };
  return null;
}

/** Text with each `<…>` sequence (and each character of the placeholder range) replaced by a placeholder. */
function extractSpecials(text) {
  const specials = [];
  const hold = (special) => {
    specials.push(special);
    return String.fromCharCode(PUA_FIRST + specials.length - 1);
  };
  const room = () => specials.length <= PUA_LAST - PUA_FIRST;
  let out = "";
  for (let i = 0; i < text.length; ) {
    const ch = text[i];
    if (isPlaceholder(ch.charCodeAt(0)) && room()) {
      out += hold({ kind: "literal", text: ch }); // the text's own character, kept as it was
      i++;
      continue;
    }
    if (ch === "<" && room()) {
      const end = closingBracket(text, i);
      let special = end > 0 ? parseSpecial(text.slice(i + 1, end)) : null;
      let next = end + 1;
      if (!special) {
        // Unbalanced, e.g. "<https://x|a < b>": try the sequence up to the first ">".
        const simple = /^<([^<>\n]*)>/.exec(text.slice(i));
        special = simple ? parseSpecial(simple[1]) : null;
        next = simple ? i + simple[0].length : 0;
      }
      if (special) {
        out += hold(special);
        i = next;
        continue;
      }
    }
    out += ch;
    i++;
  }
  return { text: out, specials };
}

/** The node a placeholder stands for. */
function specialNode(special, options) {
  switch (special.kind) {
    case "user":
      return h("span", { class: "mention", "data-user": special.id }, `@${special.label || mentionName(special.id)}`);
    case "channel":
      return h("span", { class: "channel-mention" }, `#${special.label || channelName(special.id)}`);
    case "broadcast":
      return h("span", { class: "mention broadcast" }, `@${special.name}`);
    case "group":
      return h("span", { class: "mention" }, special.label ? special.label.replace(/^@?/, "@") : `@${special.id}`);
    case "date":
      return h("span", { class: "date", title: special.fallback ? decodeEntities(special.fallback) : null },
        formatSlackDate(special.seconds, special.format, special.fallback && decodeEntities(special.fallback)));
    case "link": {
      const url = safeUrl(decodeEntities(special.url));
      const label = special.label ? inlineMrkdwn(special.label, options) : decodeEntities(special.url);
      return url ? link(url, label) : fragment(label);
    }
    case "mailto":
      return fragment(special.label ? inlineMrkdwn(special.label, options) : decodeEntities(special.url.slice(7)));
    default:
      return document.createTextNode(special.text || "");
  }
}

/** Text with placeholders → text nodes (entities decoded once, emoji drawn) and the specials' nodes. */
function emitText(text, specials, { emoji = true, options = {} } = {}) {
  const nodes = [];
  let run = "";
  const flush = () => {
    if (run) nodes.push(document.createTextNode(emoji ? emojify(decodeEntities(run)) : decodeEntities(run)));
    run = "";
  };
  for (const ch of text) {
    const code = ch.charCodeAt(0);
    if (ch.length === 1 && isPlaceholder(code) && specials[code - PUA_FIRST]) {
      flush();
      nodes.push(specialNode(specials[code - PUA_FIRST], options));
    } else {
      run += ch;
    }
  }
  flush();
  return nodes;
}

// Formatting rules within a line. Slack's delimiters count at word edges only (so snake_case stays as is).
const EDGE = "[\\p{L}\\p{N}_";
const INLINE_RULES = [
  { kind: "code", re: /`([^`\n]+)`/gu },
  { kind: "mdlink", markdown: true, re: /\[([^\]\n]+)\]\(([^)\s]+)\)/gu },
  { kind: "strong", markdown: true, re: /\*\*(?!\s)([^\n]+?)(?<!\s)\*\*/gu },
  { kind: "strong", re: new RegExp(`(?<!${EDGE}*])\\*(?!\\s)([^*\\n]+?)(?<!\\s)\\*(?!${EDGE}*])`, "gu") },
  { kind: "em", re: new RegExp(`(?<!${EDGE}])_(?!\\s)([^_\\n]+?)(?<!\\s)_(?!${EDGE}])`, "gu") },
  { kind: "s", re: new RegExp(`(?<!${EDGE}~])~(?!\\s)([^~\\n]+?)(?<!\\s)~(?!${EDGE}~])`, "gu") },
  { kind: "url", markdown: true, re: /https?:\/\/[^\s<>"'`\u{e000}-\u{f8ff}]+/gu },
];

/** The earliest formatting match in `text` from `from`, among the rules that apply. */
function nextMatch(text, from, markdown) {
  let best = null;
  for (const rule of INLINE_RULES) {
    if (rule.markdown && !markdown) continue;
    rule.re.lastIndex = from;
    const m = rule.re.exec(text);
    if (m && (!best || m.index < best.m.index)) best = { rule, m };
  }
  return best;
}

/** One line (placeholders included) → nodes. */
function inlineNodes(text, specials, options) {
  const nodes = [];
  let at = 0;
  while (at < text.length) {
    const found = nextMatch(text, at, options.markdown);
    if (!found) break;
    const { rule, m } = found;
    let whole = m[0];
    if (rule.kind === "url") whole = whole.replace(/[.,;:!?)\]]+$/, ""); // sentence punctuation is not the URL's
    nodes.push(...emitText(text.slice(at, m.index), specials, { options }));
    nodes.push(formatted(rule.kind, m, whole, specials, options));
    at = m.index + whole.length;
  }
  nodes.push(...emitText(text.slice(at), specials, { options }));
  return nodes;
}

function formatted(kind, m, whole, specials, options) {
  switch (kind) {
    case "code":
      return h("code", {}, emitText(m[1], specials, { emoji: false, options }));
    case "mdlink": {
      const url = safeUrl(decodeEntities(m[2]));
      const label = inlineNodes(m[1], specials, options);
      return url ? link(url, label) : fragment(emitText(whole, specials, { options }));
    }
    case "url": {
      const url = safeUrl(decodeEntities(whole));
      return url ? link(url, decodeEntities(whole)) : fragment(emitText(whole, specials, { options }));
    }
    default:
      return h(kind, {}, inlineNodes(m[1], specials, options));
  }
}

/** A link label or other short mrkdwn on its own (its own `<…>` sequences included). */
function inlineMrkdwn(text, options = {}) {
  const { text: held, specials } = extractSpecials(text);
  return inlineNodes(held, specials, options);
}

/** Cut text into ``` code blocks and the text between; in Markdown an unclosed fence (still streaming) runs
 *  to the end and a fence's language name is dropped. */
function splitFences(text, markdown) {
  const parts = [];
  const fence = /```([\s\S]*?)```/g;
  let at = 0;
  let m;
  while ((m = fence.exec(text))) {
    if (m.index > at) parts.push({ text: text.slice(at, m.index) });
    parts.push({ code: trimFence(m[1], markdown) });
    at = m.index + m[0].length;
  }
  const rest = text.slice(at);
  const open = markdown ? rest.indexOf("```") : -1;
  if (open >= 0) {
    if (open > 0) parts.push({ text: rest.slice(0, open) });
    parts.push({ code: trimFence(rest.slice(open + 3), markdown) });
  } else if (rest) {
    parts.push({ text: rest });
  }
  return parts;
}

function trimFence(code, markdown) {
  let body = code;
  if (markdown) body = body.replace(/^[\w+#.-]+\n/, ""); // ```python
  return body.replace(/^\n/, "").replace(/\n$/, "");
}

/** mrkdwn (or Markdown, with options.markdown) → a fragment. */
function renderMrkdwn(text, options = {}) {
  const { text: held, specials } = extractSpecials(String(text ?? ""));
  const out = document.createDocumentFragment();
  const parts = splitFences(held, options.markdown);
  parts.forEach((part, i) => {
    if (part.code !== undefined) {
      out.append(h("pre", { class: "code-block" }, emitText(part.code, specials, { emoji: false, options })));
      return;
    }
    let body = part.text;
    // The line breaks around a fence belong to the fence: a code block is a block already.
    if (i > 0 && parts[i - 1].code !== undefined) body = body.replace(/^\n/, "");
    if (i < parts.length - 1) body = body.replace(/\n$/, "");
    out.append(renderLines(body, specials, options));
  });
  return out;
}

const QUOTE = /^(?:&gt;|>)(?!(?:&gt;|>){2})\s?(.*)$/;
const QUOTE_REST = /^(?:&gt;|>){3}\s?(.*)$/;

/** Lines → nodes: quotes (and Markdown's headings, list items and rules) are blocks; other lines join with <br>. */
function renderLines(text, specials, options) {
  const entries = []; // {inline: nodes} or {block: element}
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if ((m = QUOTE_REST.exec(line))) {
      // ">>>" quotes everything after it.
      const rest = [m[1], ...lines.slice(i + 1)];
      entries.push({ block: quoteBlock(rest, specials, options) });
      break;
    }
    if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        quoted.push(m[1]);
        i++;
      }
      i--;
      entries.push({ block: quoteBlock(quoted, specials, options) });
      continue;
    }
    entries.push(markdownLine(line, specials, options) || { inline: inlineNodes(line, specials, options) });
  }
  const out = document.createDocumentFragment();
  entries.forEach((entry, i) => {
    if (entry.block) return out.append(entry.block);
    appendAll(out, entry.inline);
    if (entries[i + 1] && entries[i + 1].inline) out.append(h("br"));
  });
  return out;
}

function quoteBlock(lines, specials, options) {
  const el = h("div", { class: "quote" });
  lines.forEach((line, i) => {
    appendAll(el, inlineNodes(line, specials, options));
    if (i < lines.length - 1) el.append(h("br"));
  });
  return el;
}

/** Markdown's line-level syntax, drawn simply: "# Title" bold, "- item" a bullet, "---" a rule. */
function markdownLine(line, specials, options) {
  if (!options.markdown) return null;
  let m;
  if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
    return { block: h("div", { class: `md-heading md-h${m[1].length}` }, inlineNodes(m[2], specials, options)) };
  }
  if (/^\s*(?:-{3,}|\*{3,}|_{3,})\s*$/.test(line)) return { block: h("hr", { class: "md-rule" }) };
  if ((m = /^(\s*)[-*+]\s+(.*)$/.exec(line))) {
    const item = h("div", { class: "md-item" }, h("span", { class: "md-bullet" }, "•"),
      h("span", { class: "md-item-text" }, inlineNodes(m[2], specials, options)));
    item.style.marginLeft = `${Math.min(m[1].length, 12) * 8}px`;
    return { block: item };
  }
  return null;
}

// ---------------------------------------------------------------------------------------------------------
// Block Kit

/** Any block or element the page cannot draw: shown as JSON, never dropped. */
function unknownNode(what, value) {
  const type = value && typeof value === "object" && value.type ? String(value.type) : typeof value;
  return h("div", { class: "unknown" },
    h("div", { class: "unknown-caption" }, `${what} ${type} — shown as JSON`),
    h("pre", { class: "unknown-block" }, JSON.stringify(value, null, 2)));
}

/** blocks → a fragment. ctx: {channel, message_ts, view} says where a button click comes from. */
function renderBlocks(blocks, ctx) {
  return fragment(blocks.map((block) => {
    try {
      return renderBlock(block, ctx);
    } catch (e) {
      // A known type with an unexpected shape: its JSON rather than nothing.
      console.warn("block not drawn", e, block);
      return unknownNode("Block", block);
    }
  }));
}

function renderBlock(block, ctx) {
  const type = block && block.type;
  switch (type) {
    case "section": return renderSection(block, ctx);
    case "context": return renderContext(block);
    case "actions": return renderActions(block, ctx);
    case "header": return h("div", { class: "block header-block" }, plainText(block.text));
    case "divider": return h("hr", { class: "block divider" });
    case "markdown": return h("div", { class: "block markdown-block" }, renderMrkdwn(block.text, { markdown: true }));
    case "rich_text": return renderRichText(block);
    case "image": return renderImageBlock(block);
    default: return unknownNode("Block", block);
  }
}

/** A text object: mrkdwn or plain_text. */
function textObject(obj) {
  if (obj && obj.type === "mrkdwn" && typeof obj.text === "string") return renderMrkdwn(obj.text);
  if (obj && obj.type === "plain_text" && typeof obj.text === "string") return plainText(obj);
  return unknownNode("Text", obj);
}

function plainText(obj) {
  if (!obj || typeof obj.text !== "string") throw new Error("not a text object");
  // plain_text is shown as written (no entities, no formatting), with emoji unless emoji: false.
  return document.createTextNode(obj.emoji === false ? obj.text : emojify(obj.text));
}

function renderSection(block, ctx) {
  const main = h("div", { class: "section-main" });
  if (block.text) main.append(h("div", { class: "section-text" }, textObject(block.text)));
  if (Array.isArray(block.fields)) {
    main.append(h("div", { class: "fields" }, block.fields.map((f) => h("div", { class: "field" }, textObject(f)))));
  }
  const el = h("div", { class: "block section" }, main);
  if (block.accessory) el.append(h("div", { class: "accessory" }, renderAccessory(block.accessory, block, ctx)));
  return el;
}

function renderAccessory(element, block, ctx) {
  if (element.type === "button") return renderButton(element, block, ctx);
  if (element.type === "image") return imageElement(element, "accessory-image");
  return unknownNode("Element", element);
}

function renderContext(block) {
  const items = (block.elements || []).map((element) => {
    if (element.type === "image") return imageElement(element, "context-image");
    if (element.type === "mrkdwn" || element.type === "plain_text") {
      return h("span", { class: "context-text" }, textObject(element));
    }
    return unknownNode("Element", element);
  });
  return h("div", { class: "block context" }, items);
}

function imageElement(element, cls) {
  const url = safeUrl(element.image_url);
  const alt = element.alt_text || "";
  if (!url) return h("span", { class: `${cls} image-missing`, title: alt }, `[${alt || "image"}]`);
  return h("img", { class: cls, src: url, alt, title: alt, loading: "lazy" });
}

function renderImageBlock(block) {
  const figure = h("figure", { class: "block image-block" });
  if (block.title) figure.append(h("figcaption", {}, plainText(block.title)));
  figure.append(imageElement(block, "block-image"));
  return figure;
}

function renderActions(block, ctx) {
  const elements = (block.elements || []).map((element) =>
    element.type === "button" ? renderButton(element, block, ctx) : unknownNode("Element", element));
  return h("div", { class: "block actions" }, elements);
}

function pendingKey(ctx, block, element) {
  return JSON.stringify([ctx.view ? "view" : ctx.message_ts, block.block_id, element.action_id, element.value]);
}

function renderButton(element, block, ctx) {
  const label = (element.text && element.text.text) || "";
  const style = element.style === "primary" || element.style === "danger" ? element.style : "default";
  const button = h("button", {
    type: "button",
    class: `btn btn-${style}`,
    "data-action-id": element.action_id,
    disabled: app.pending.has(pendingKey(ctx, block, element)),
  }, emojify(label));
  button.addEventListener("click", (event) => {
    event.stopPropagation(); // a click on a button is not a click on its message (which opens the thread)
    clickButton(button, element, block, ctx, label);
  });
  return button;
}

async function clickButton(button, element, block, ctx, label) {
  const confirm = element.confirm;
  if (confirm) {
    const title = (confirm.title && confirm.title.text) || "";
    const text = (confirm.text && confirm.text.text) || "";
    if (!window.confirm(`${title}\n\n${text}`)) return;
  }
  const key = pendingKey(ctx, block, element);
  app.pending.add(key);
  button.disabled = true;
  const body = {
    user: me(),
    channel: ctx.view ? null : ctx.channel,
    message_ts: ctx.view ? null : ctx.message_ts,
    // Slack sends every field as a string (a button without a value sends none; the server wants strings).
    action_id: element.action_id ?? "",
    block_id: block.block_id ?? "",
    value: element.value ?? "",
    text: label,
  };
  if (ctx.view) body.view = true;
  try {
    await api("POST", "/api/actions", body);
  } catch (e) {
    showError(e.message);
  } finally {
    app.pending.delete(key);
    button.disabled = false;
    render();
    requestState();
  }
  const url = element.url && safeUrl(element.url);
  if (url) window.open(url, "_blank", "noopener,noreferrer");
}

// rich_text: what Slack's own composer sends.

function renderRichText(block) {
  return h("div", { class: "block rich-text" }, (block.elements || []).map(richBlock));
}

function richBlock(element) {
  switch (element.type) {
    case "rich_text_section":
      return h("div", { class: "rt-section" }, richInline(element.elements));
    case "rich_text_preformatted":
      return h("pre", { class: "code-block" }, richInline(element.elements, true));
    case "rich_text_quote":
      return h("div", { class: "quote" }, richInline(element.elements));
    case "rich_text_list": {
      const list = h(element.style === "ordered" ? "ol" : "ul", { class: "rt-list" },
        (element.elements || []).map((item) =>
          h("li", {}, item.type === "rich_text_section" ? richInline(item.elements) : richBlock(item))));
      if (element.style === "ordered" && element.offset) list.setAttribute("start", String(Number(element.offset) + 1));
      list.style.marginLeft = `${Math.min(Number(element.indent) || 0, 8) * 24}px`;
      return list;
    }
    default:
      return unknownNode("Element", element);
  }
}

function richInline(elements, preformatted) {
  return (elements || []).map((element) => {
    const node = richInlineNode(element, preformatted);
    return element.style && typeof element.style === "object" ? styled(node, element.style) : node;
  });
}

function richInlineNode(element, preformatted) {
  switch (element.type) {
    case "text":
      return document.createTextNode(String(element.text ?? ""));
    case "link": {
      const url = safeUrl(element.url);
      const label = element.text || element.url || "";
      return url ? link(url, label) : document.createTextNode(label);
    }
    case "user":
      return h("span", { class: "mention", "data-user": element.user_id }, `@${mentionName(element.user_id)}`);
    case "usergroup":
      return h("span", { class: "mention" }, `@${element.usergroup_id}`);
    case "channel":
      return h("span", { class: "channel-mention" }, `#${channelName(element.channel_id)}`);
    case "broadcast":
      return h("span", { class: "mention broadcast" }, `@${element.range}`);
    case "emoji":
      return document.createTextNode(emojiOf(element, preformatted));
    case "date":
      return h("span", { class: "date" },
        formatSlackDate(Number(element.timestamp), element.format || "{date_short_pretty} {time}", element.fallback));
    case "color":
      return document.createTextNode(String(element.value ?? ""));
    default:
      return unknownNode("Element", element);
  }
}

function emojiOf(element, preformatted) {
  if (!preformatted && typeof element.unicode === "string" && /^[0-9a-f]+(-[0-9a-f]+)*$/i.test(element.unicode)) {
    try {
      return String.fromCodePoint(...element.unicode.split("-").map((hex) => parseInt(hex, 16)));
    } catch {
      // Not a code point: the name below.
    }
  }
  return preformatted ? `:${element.name}:` : EMOJI[element.name] || `:${element.name}:`;
}

function styled(node, style) {
  let out = node;
  if (style.code) out = h("code", {}, out);
  if (style.strike) out = h("s", {}, out);
  if (style.italic) out = h("em", {}, out);
  if (style.bold) out = h("strong", {}, out);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Messages

function isTopLevel(message) {
  return !message.thread_ts || message.thread_ts === message.ts;
}

function repliesOf(ts) {
  return app.state.messages.filter((m) => m.thread_ts === ts && m.ts !== ts);
}

/** A thread parent's summary: the reply count, who replied, when last. */
function threadSummary(message) {
  const replies = repliesOf(message.ts);
  const count = typeof message.reply_count === "number" ? message.reply_count : replies.length;
  if (!count) return null;
  const authors = [];
  for (const reply of replies) {
    const key = isBot(reply) ? "bot" : reply.user;
    if (!authors.some((a) => a.key === key)) authors.push({ key, message: reply });
  }
  const last = replies.length ? replies[replies.length - 1].ts : message.latest_reply || null;
  return { count, authors: authors.slice(0, 5), last };
}

/** Everything a message's drawing depends on: a node is rebuilt only when this changes. */
function messageSignature(message, flags) {
  const buttons = [...app.pending].filter((key) => key.includes(JSON.stringify(message.ts)));
  return JSON.stringify([message, flags, buttons, app.namesSignature]);
}

/** One message (or ephemeral) element: avatar, name, time, body, files, and a thread parent's summary. */
function buildMessage(message, flags) {
  const bot = isBot(message);
  const time = tsDate(message.ts);
  const classes = ["message"];
  if (flags.ephemeral) classes.push("ephemeral");
  if (flags.continuation) classes.push("continuation");
  if (bot) classes.push("from-bot");
  if (message.streaming) classes.push("streaming");
  const el = h("div", {
    class: classes.join(" "),
    "data-ts": message.ts,
    "data-user": message.user || (bot ? app.state.bot.id : ""),
  });
  if (flags.ephemeral) {
    el.append(h("div", { class: "ephemeral-note" }, h("span", { class: "eye", "aria-hidden": "true" }, "👁"),
      " Only visible to you"));
  }
  const meta = h("div", { class: "meta" },
    h("span", { class: "name" }, displayName(message)),
    bot ? h("span", { class: "app-badge" }, "APP") : null,
    h("span", { class: "time", title: time.toLocaleString("en-US") }, clock(time)));
  const content = h("div", { class: "content" }, meta, messageBody(message, flags));
  if (flags.summary) content.append(summaryNode(flags.summary));
  el.append(h("div", { class: "row" },
    h("div", { class: "gutter" }, avatar(message), h("span", { class: "gutter-time" }, clock(time))),
    content));
  return el;
}

function messageBody(message, flags) {
  const ctx = { channel: message.channel || app.state.channel.id, message_ts: message.ts, view: false };
  const body = h("div", { class: "body" });
  if (Array.isArray(message.blocks) && message.blocks.length) body.append(renderBlocks(message.blocks, ctx));
  else if (message.text) {
    // Trailing line breaks show nothing in Slack (and would put a streaming cursor on a line of its own).
    body.append(h("div", { class: "text" }, renderMrkdwn(message.text.replace(/\s+$/, ""), { markdown: true })));
  }
  for (const attachment of Array.isArray(message.attachments) ? message.attachments : []) {
    body.append(unknownNode("Attachment", attachment));
  }
  if (message.edited && !isBot(message)) body.append(h("span", { class: "edited" }, " (edited)"));
  if (Array.isArray(message.files)) body.append(...message.files.map(fileCard));
  if (message.streaming) streamingEnd(body).append(h("span", { class: "cursor", "aria-hidden": "true" }));
  if (!body.hasChildNodes() && !flags.ephemeral) body.append(h("span", { class: "empty" }, "(empty message)"));
  return body;
}

/** Where a blinking cursor goes: after the last text, inside the last block that holds it. */
function streamingEnd(body) {
  let target = body;
  const holders = new Set(["DIV", "PRE", "LI", "UL", "OL"]);
  const holds = (el) => holders.has(el.tagName) || el.classList.contains("md-item-text");
  while (target.lastChild && target.lastChild === target.lastElementChild && holds(target.lastChild)) {
    target = target.lastChild;
  }
  return target;
}

/** A file in a message, as Slack draws it: a card with its name, its type and size, and for a picture (one
 *  the server can show: /api/files/<id> answers only real PNG, JPEG, GIF or WebP bytes) a thumbnail. */
function fileCard(file) {
  const name = String(file.name || "file");
  const title = file.title && file.title !== name ? String(file.title) : null;
  const kind = fileKind(file);
  const card = h("div", { class: "file-card", "data-file-id": file.id || null },
    h("div", { class: "file-icon", "aria-hidden": "true" }, kind === "Image" ? "🖼" : "📄"),
    h("div", { class: "file-info" },
      h("div", { class: "file-title" }, emojify(title || name)),
      h("div", { class: "file-meta" }, [title ? name : null, kind, formatSize(file.size) || null].filter(Boolean).join(" · "))));
  if (kind !== "Image" || typeof file.id !== "string" || !/^F\w+$/.test(file.id)) return card;
  const thumb = h("img", { class: "file-thumb", src: `/api/files/${file.id}`, alt: name, loading: "lazy" });
  thumb.addEventListener("error", () => thumb.remove()); // not a picture after all: the card alone
  return h("div", { class: "file-with-thumb" }, thumb, card);
}

/** What Slack writes under a file's name: "PNG", "Plain Text", "PDF"… from its filetype or mimetype. */
function fileKind(file) {
  const mimetype = String(file.mimetype || "");
  if (/^image\/(png|jpeg|gif|webp)$/.test(mimetype)) return "Image";
  const known = { text: "Plain Text", txt: "Plain Text", pdf: "PDF", md: "Markdown", markdown: "Markdown",
    json: "JSON", csv: "CSV", zip: "Zip", log: "Plain Text", py: "Python", js: "JavaScript", html: "HTML" };
  const type = String(file.filetype || "").toLowerCase();
  if (known[type]) return known[type];
  if (type && /^[\w+-]{1,12}$/.test(type)) return type.toUpperCase();
  return mimetype.split("/")[0] === "text" ? "Plain Text" : "Binary";
}

function summaryNode(summary) {
  const count = `${summary.count} ${summary.count === 1 ? "reply" : "replies"}`;
  let last = "";
  if (summary.last) {
    const date = tsDate(summary.last);
    const day = dayLabel(date);
    const on = day === "Today" || day === "Yesterday" ? day.toLowerCase() : `on ${day}`;
    last = `Last reply ${on} at ${clock(date)}`;
  }
  return h("div", { class: "thread-summary" },
    summary.authors.map((a) => avatar(a.message, true)),
    h("span", { class: "replies", role: "link", tabindex: "0" }, count),
    h("span", { class: "last-reply" }, last));
}

/** Messages and ephemerals of one list in ts order, with Slack's grouping of one author's runs. */
function messageItems(entries, { summaries }) {
  entries.sort((a, b) => compareTs(a.message.ts, b.message.ts));
  const items = [];
  let previous = null;
  for (const entry of entries) {
    const message = entry.message;
    const flags = { ephemeral: entry.ephemeral, continuation: continues(previous, entry) };
    if (summaries && !entry.ephemeral) flags.summary = threadSummary(message);
    if (flags.summary) flags.continuation = false;
    items.push({
      key: `${entry.ephemeral ? "e" : "m"}:${message.ts}`,
      signature: messageSignature(message, flags),
      build: () => buildMessage(message, flags),
      entry,
    });
    previous = flags.summary ? null : entry; // a thread parent ends a group, as in Slack
  }
  return items;
}

function continues(previous, entry) {
  if (!previous || previous.ephemeral || entry.ephemeral) return false;
  const a = previous.message;
  const b = entry.message;
  const author = (m) => (isBot(m) ? "bot" : m.user);
  const gap = tsDate(b.ts) - tsDate(a.ts);
  return author(a) === author(b) && gap >= 0 && gap < GROUP_SECONDS * 1000 && sameDay(tsDate(a.ts), tsDate(b.ts));
}

/** Day dividers between the channel's messages of different days. */
function withDays(items) {
  const out = [];
  let day = null;
  for (const item of items) {
    const date = tsDate(item.entry.message.ts);
    if (!day || !sameDay(day, date)) {
      const label = dayLabel(date);
      out.push({ key: `day:${date.toDateString()}`, signature: label, build: () => dayDivider(label) });
      day = date;
    }
    out.push(item);
  }
  return out;
}

function dayDivider(label) {
  return h("div", { class: "day-divider" }, h("span", {}, label));
}

/** Make container's children the items' nodes, in order, reusing the nodes whose signature is unchanged. */
function reconcile(container, items) {
  const existing = new Map();
  for (const child of container.children) if (child.dataset.key) existing.set(child.dataset.key, child);
  const nodes = items.map((item) => {
    const old = existing.get(item.key);
    if (old && signatures.get(old) === item.signature) return old;
    const node = item.build();
    node.dataset.key = item.key;
    signatures.set(node, item.signature);
    followBottom.observe(node);
    return node;
  });
  nodes.forEach((node, i) => {
    if (container.children[i] !== node) container.insertBefore(node, container.children[i] || null);
  });
  while (container.children.length > nodes.length) {
    followBottom.unobserve(container.lastElementChild);
    container.lastElementChild.remove();
  }
}

// ---------------------------------------------------------------------------------------------------------
// Scrolling: a list the reader has scrolled up stays put; one at the bottom follows new content, also when
// content grows between renders (a font or an image that arrives late).

const unpinned = new WeakSet(); // lists the reader scrolled away from the bottom

function isPinned(el) {
  return !unpinned.has(el);
}

function trackPinning(el) {
  el.addEventListener("scroll", () => {
    if (el.scrollHeight - el.scrollTop - el.clientHeight < BOTTOM_SLACK) unpinned.delete(el);
    else unpinned.add(el);
  });
}

const followBottom = new ResizeObserver(() => {
  for (const el of [$("#channel-messages"), $("#thread-messages")]) {
    if (isPinned(el)) el.scrollTop = el.scrollHeight;
  }
});

function restoreScroll(el, top, toBottom) {
  if (toBottom) unpinned.delete(el);
  if (isPinned(el)) el.scrollTop = el.scrollHeight;
  else el.scrollTop = top;
}

// ---------------------------------------------------------------------------------------------------------
// The page

function render() {
  const state = app.state;
  if (!state) return;
  app.namesSignature = JSON.stringify([state.users, state.bot, state.channel]);
  // Scroll positions are taken before anything changes and given back once every pane has its final size
  // (opening the thread pane narrows the channel, which makes it taller).
  const lists = ["#channel-messages", "#thread-messages", "#home-blocks"].map((sel) => $(sel));
  const tops = lists.map((el) => el.scrollTop);
  const threadBefore = app.renderedThread;
  renderSidebar(state);
  renderModelBanner(state.model);
  const home = app.view === "home";
  $("#channel").hidden = home;
  $("#home").hidden = !home;
  $("#nav-channel").classList.toggle("active", !home);
  $("#nav-home").classList.toggle("active", home);
  if (home) renderHome(state);
  else renderChannel(state);
  renderThread(state);
  const [channel, thread, homeBlocks] = lists;
  restoreScroll(channel, tops[0], false);
  restoreScroll(thread, tops[1], app.renderedThread !== threadBefore);
  homeBlocks.scrollTop = tops[2];
}

function renderSidebar(state) {
  document.title = `#${state.channel.name} — ${state.team || "mm playground"}`;
  $("#team-name").textContent = state.team || "mm playground";
  $("#nav-channel-name").textContent = state.channel.name;
  $("#channel-name").textContent = state.channel.name;
  $("#thread-channel-name").textContent = state.channel.name;
  $("#nav-bot-name").textContent = state.bot.name;
  $("#home-title").textContent = `${state.bot.name} — Home`;
  $("#composer").placeholder =
    `Message #${state.channel.name} — mention @${state.bot.name} to start, /mm help for commands`;
  renderWorkspaces(state);
  renderUserPicker(state);
  $("#overlay-yaml").textContent = state.overlay || "(no overlay)";
  $("#config-path").textContent = state.config_path
    ? `What the playground adds to ${state.config_path}:`
    : "What the playground adds to the defaults (no config file):";
  const model = state.model || {};
  $("#model-line").textContent = model.demo ? "Model: demo (scripted)" : `Model: ${model.name || "?"}`;
  $("#model-line").title = model.url || "";
  renderForgeLine(state.forge_url);
}

function renderForgeLine(url) {
  // The forge emulator's page, which lists the pull requests the threads opened (another origin: a new tab).
  const line = $("#forge-line");
  line.hidden = !url;
  if (!url || signatures.get(line) === url) return;
  signatures.set(line, url);
  line.replaceChildren("Pull requests: ", h("a", {
    href: url,
    target: "_blank",
    rel: "noopener noreferrer",
    // The emulator serves HTTPS with a certificate of its own CA, which the browser does not know.
    title: "The playground's GitHub emulator; your browser asks about its certificate, made for this run",
  }, url));
}

/** The workspace switcher, when the playground shows more than one: a person belongs to one workspace, as an
 *  account in Slack does, so switching is becoming someone of the other (the one last chosen there). */
function renderWorkspaces(state) {
  const box = $("#workspaces");
  const workspaces = state.workspaces || [];
  box.hidden = workspaces.length < 2;
  const signature = JSON.stringify([workspaces, state.team_id]);
  if (box.hidden || signatures.get(box) === signature) return;
  signatures.set(box, signature);
  box.replaceChildren(...workspaces.map((w) => {
    const current = w.id === state.team_id;
    return h("button", {
      type: "button",
      class: current ? "team-choice active" : "team-choice",
      "aria-pressed": current ? "true" : "false",
      title: current ? `You are in ${w.name}` : `Switch to ${w.name}`,
      onclick: () => switchWorkspace(w),
    }, h("span", { class: "team-choice-icon", "aria-hidden": "true" }, w.name.slice(0, 1)), w.name);
  }));
}

function switchWorkspace(workspace) {
  if (!app.state || workspace.id === app.state.team_id) return;
  app.usersByTeam[app.state.team_id] = me();
  setUser(app.usersByTeam[workspace.id] || workspace.user, true);
  app.userConfirmed = true;
  app.thread = null; // the open thread is in the other workspace's channel
  requestState();
  if (app.view === "home") openHome(); // the App Home is that person's
}

function renderUserPicker(state) {
  const select = $("#user");
  const signature = JSON.stringify(state.users);
  if (signatures.get(select) !== signature) {
    // Rebuilt only when the users change: rebuilding an open <select> would close it under the pointer.
    select.replaceChildren(...state.users.map((u) =>
      h("option", { value: u.id }, `${u.real_name || u.name} — ${u.note || u.role || ""}`)));
    signatures.set(select, signature);
  }
  if (select.value !== me()) select.value = me();
}

function renderModelBanner(model) {
  const banner = $("#model-banner");
  if (!model) {
    banner.hidden = true;
    return;
  }
  const signature = JSON.stringify(model);
  if (signatures.get(banner) === signature) return;
  signatures.set(banner, signature);
  if (model.demo) {
    banner.className = "model-banner demo";
    banner.replaceChildren(
      h("div", { class: "model-banner-title" }, "⚠ Demo model — scripted, not a real model"),
      model.note ? h("div", { class: "model-note" }, model.note) : null);
  } else {
    banner.className = "model-banner real";
    banner.replaceChildren(`Model: ${model.name || "?"} at ${model.url || "?"}`);
  }
  banner.hidden = false;
}

function renderChannel(state) {
  const list = $("#channel-messages");
  const entries = [
    ...state.messages.filter(isTopLevel).map((message) => ({ message, ephemeral: false })),
    ...(state.ephemerals || []).filter((e) => !e.thread_ts).map((message) => ({ message, ephemeral: true })),
  ];
  const items = withDays(messageItems(entries, { summaries: true }));
  if (!items.length) {
    items.push({ key: "empty", signature: "empty", build: () => emptyChannel(state) });
  }
  reconcile(list, items);
}

function emptyChannel(state) {
  return h("div", { class: "channel-intro" },
    h("div", { class: "channel-intro-title" }, `This is the very beginning of #${state.channel.name}`),
    h("div", {}, `Mention @${state.bot.name} in a message to start a thread; /mm help lists the commands.`));
}

function renderThread(state) {
  const pane = $("#thread");
  if (!app.thread || app.view !== "channel") {
    pane.hidden = true;
    app.renderedThread = null;
    return;
  }
  pane.hidden = false;
  const list = $("#thread-messages");
  const ts = app.thread;
  const parent = state.messages.find((m) => m.ts === ts);
  const replies = repliesOf(ts).map((message) => ({ message, ephemeral: false }));
  const ephemerals = (state.ephemerals || []).filter((e) => e.thread_ts === ts).map((message) => ({ message, ephemeral: true }));
  const items = [];
  if (parent) {
    items.push({
      key: `parent:${ts}`,
      signature: messageSignature(parent, { parent: true }),
      build: () => buildMessage(parent, { parent: true }),
    });
  } else {
    items.push({ key: "no-parent", signature: "", build: () => h("div", { class: "loading" }, "Loading…") });
  }
  if (replies.length) {
    const label = `${replies.length} ${replies.length === 1 ? "reply" : "replies"}`;
    items.push({ key: "count", signature: label, build: () => h("div", { class: "thread-divider" }, h("span", {}, label)) });
  }
  items.push(...messageItems([...replies, ...ephemerals], { summaries: false }));
  const status = (state.statuses || {})[ts];
  if (status) items.push({ key: "status", signature: status, build: () => statusNode(status) });
  reconcile(list, items);
  app.renderedThread = ts;
}

/** The bot's assistant status under the thread, as Slack shows it: "mm is thinking…", with animated dots. */
function statusNode(text) {
  return h("div", { class: "status" },
    h("span", { class: "dots", "aria-hidden": "true" }, h("span"), h("span"), h("span")),
    h("span", { class: "status-text" }, h("b", {}, app.state.bot.name), " ", emojify(text)));
}

function renderHome(state) {
  const container = $("#home-blocks");
  const home = state.home;
  const item = home && Array.isArray(home.blocks)
    ? {
      key: "view",
      signature: JSON.stringify([home, [...app.pending].filter((k) => k.startsWith('["view"')), app.namesSignature]),
      build: () => h("div", { class: "home-view" }, renderBlocks(home.blocks, { view: true, message_ts: null })),
    }
    : { key: "loading", signature: "", build: () => h("div", { class: "loading" }, "Loading…") };
  reconcile(container, [item]);
}

// ---------------------------------------------------------------------------------------------------------
// What the person does

function openThread(ts, focus) {
  app.thread = ts;
  render();
  if (focus) $("#thread-composer").focus();
}

function closeThread() {
  app.thread = null;
  render();
}

async function openHome() {
  app.view = "home";
  render();
  try {
    // Opening the tab is an event for the bot (app_home_opened): it publishes the view we then fetch.
    await api("POST", "/api/home", { user: me() });
  } catch (e) {
    showError(e.message);
  }
}

function openChannel() {
  app.view = "channel";
  render();
}

/** "/mm help" → "help"; null when the text is not the /mm command. */
function slashCommand(text) {
  const m = /^\/mm(?:\s+([\s\S]*))?$/.exec(text.trim());
  return m ? (m[1] || "").trim() : null;
}

function mentionsBot(text) {
  const { bot, mention } = app.state;
  const name = (bot.name || "mm").replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`(^|[^\\w@])@${name}\\b`, "i").test(text) || (mention && text.includes(mention));
}

/** Send what a composer holds: a /mm command, or a message (in the thread when threadTs is given) with the file
 *  chosen for it, if any. */
async function send(composer, threadTs) {
  const textarea = composer.textarea;
  const text = textarea.value;
  const file = composer.file;
  if ((!text.trim() && !file) || !app.state) return;
  const limit = app.state.max_file_bytes;
  if (file && typeof limit === "number" && file.size > limit) {
    // Not read nor sent: the server would refuse it the same way, after the whole upload.
    showError(`${file.name} is too large for the playground (${formatSize(file.size)}): it takes files of at most ${formatSize(limit)}.`);
    return;
  }
  textarea.value = ""; // cleared at once, as in Slack; given back if the server refuses
  autosize(textarea);
  choose(composer, null);
  try {
    const command = file ? null : slashCommand(text);
    if (command !== null) {
      await api("POST", "/api/commands", { user: me(), text: command });
    } else {
      const body = { user: me(), text };
      if (threadTs) body.thread_ts = threadTs;
      if (file) body.file = { name: file.name, mimetype: file.type || null, data: await base64Of(file) };
      const answer = await api("POST", "/api/messages", body);
      // A mention at the top level starts a thread: open it, where the bot answers.
      if (!threadTs && answer && answer.ts && mentionsBot(text)) app.thread = answer.ts;
    }
    requestState();
  } catch (e) {
    if (!textarea.value) {
      textarea.value = text;
      autosize(textarea);
    }
    if (file && !composer.file) choose(composer, file);
    showError(e.message);
  }
}

/** A file's bytes as base64 (what the server's JSON carries). */
function base64Of(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
    reader.onerror = () => reject(new Error(`${file.name} could not be read (${reader.error && reader.error.message}).`));
    reader.readAsDataURL(file);
  });
}

/** The file that goes with a composer's next message (null: none), shown above it with a way to drop it. */
function choose(composer, file) {
  composer.file = file;
  composer.input.value = "";
  const chip = composer.chip;
  if (!file) {
    chip.hidden = true;
    chip.replaceChildren();
    return;
  }
  chip.replaceChildren(
    h("span", { class: "file-chosen-name" }, `📎 ${file.name}`),
    h("span", { class: "file-chosen-size" }, ` ${formatSize(file.size)}`),
    h("button", { type: "button", class: "file-chosen-drop", "aria-label": `Remove ${file.name}`,
      onclick: () => choose(composer, null) }, "×"));
  chip.hidden = false;
}

function autosize(textarea) {
  textarea.style.height = "auto";
  textarea.style.height = `${Math.min(textarea.scrollHeight, 200)}px`;
}

function wireComposer(composer, button, threadOf) {
  const { textarea, input, area } = composer;
  textarea.addEventListener("keydown", (event) => {
    // Enter sends, Shift+Enter is a new line; not while an input method is composing a character.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send(composer, threadOf());
    }
  });
  textarea.addEventListener("input", () => autosize(textarea));
  button.addEventListener("click", () => {
    send(composer, threadOf());
    textarea.focus();
  });
  input.addEventListener("change", () => {
    if (input.files && input.files[0]) choose(composer, input.files[0]);
    textarea.focus();
  });
  // A file dropped on the composer goes with the next message, as in Slack.
  area.addEventListener("dragover", (event) => {
    if (![...(event.dataTransfer?.types || [])].includes("Files")) return;
    event.preventDefault();
    area.classList.add("dropping");
  });
  area.addEventListener("dragleave", () => area.classList.remove("dropping"));
  area.addEventListener("drop", (event) => {
    area.classList.remove("dropping");
    const dropped = event.dataTransfer && event.dataTransfer.files[0];
    if (!dropped) return;
    event.preventDefault();
    choose(composer, dropped);
    textarea.focus();
  });
}

function composerOf(prefix) {
  return {
    textarea: $(`#${prefix}composer`),
    input: $(`#${prefix}file`),
    chip: $(`#${prefix}file-chosen`),
    area: $(`#${prefix}composer-area`),
    file: null,
  };
}

/** A click on a channel message opens its thread, unless it was on a link or button or selected text. */
function onChannelClick(event) {
  const target = event.target;
  if (target.closest("a, button, pre.unknown-block")) return;
  const message = target.closest(".message");
  if (!message || message.classList.contains("ephemeral")) return;
  const selection = window.getSelection();
  if (selection && !selection.isCollapsed && message.contains(selection.anchorNode)) return;
  openThread(message.dataset.ts, true);
}

function onChannelKey(event) {
  if ((event.key === "Enter" || event.key === " ") && event.target.classList.contains("replies")) {
    event.preventDefault();
    const message = event.target.closest(".message");
    if (message) openThread(message.dataset.ts, true);
  }
}

function start() {
  wireComposer(composerOf(""), $("#send"), () => null);
  wireComposer(composerOf("thread-"), $("#thread-send"), () => app.thread);
  trackPinning($("#channel-messages"));
  trackPinning($("#thread-messages"));
  $("#channel-messages").addEventListener("click", onChannelClick);
  $("#channel-messages").addEventListener("keydown", onChannelKey);
  $("#thread-close").addEventListener("click", closeThread);
  $("#error-close").addEventListener("click", hideError);
  $("#nav-channel").addEventListener("click", openChannel);
  $("#nav-home").addEventListener("click", openHome);
  $("#user").addEventListener("change", (event) => {
    setUser(event.target.value, true);
    app.userConfirmed = true;
    requestState();
    // Each person has their own App Home: opening it is their event.
    if (app.view === "home") openHome();
  });
  document.addEventListener("keydown", (event) => {
    // Escape closes the thread, unless the person is typing (or choosing) something.
    if (event.key === "Escape" && app.thread && !event.target.closest("textarea, select, input")) closeThread();
  });
  requestState();
  connectEvents();
}

document.addEventListener("DOMContentLoaded", start);
