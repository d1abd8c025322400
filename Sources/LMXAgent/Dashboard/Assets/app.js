// The lmx-agent dashboard: follows the agent's change stream (/dashboard/api/watch: a snapshot,
// then numbered changes; resumed with ?since= after a reconnect) and draws it. Standard library
// only. Every text from servers is set with textContent, never parsed as HTML.
'use strict';

const state = {
  status: null,
  seq: null,
  history: new Map(), // route id -> [{at, ms}]
  lastLine: 0,
};
const HISTORY = 40;
const VERDICTS = {
  'ready': ['ready', 'ok'],
  'alive-not-ready': ['no model loaded', 'warn'],
  'overloaded': ['busy', 'warn'],
  'auth-rejected': ['key refused', 'bad'],
  'tunnel-down': ['tunnel down', 'bad'],
  'wrong-service': ['not an LMX server', 'bad'],
  'down': ['down', 'bad'],
};

function $(id) { return document.getElementById(id); }

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null) continue;
    if (key === 'text') node.textContent = value;
    else if (key.startsWith('data-') || key.startsWith('aria-') || key === 'role' || key === 'title') node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

async function getJSON(path) {
  const response = await fetch(path, { cache: 'no-store', credentials: 'omit' });
  if (!response.ok) throw new Error(path + ': HTTP ' + response.status);
  return response.json();
}

function when(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? '' : date.toLocaleTimeString();
}

function relative(iso) {
  const ms = new Date(iso).getTime() - Date.now();
  if (Number.isNaN(ms)) return '';
  const abs = Math.abs(ms);
  const [n, unit] = abs >= 86400e3 ? [abs / 86400e3, 'day'] : abs >= 3600e3 ? [abs / 3600e3, 'hour'] : [abs / 60e3, 'minute'];
  const count = Math.max(1, Math.round(n));
  const text = count + ' ' + unit + (count === 1 ? '' : 's');
  return ms >= 0 ? 'in ' + text : text + ' ago';
}

// What a route is, in the words of the page: its verdict, or what keeps it from being used.
function verdictOf(route) {
  if (route.trust === 'impostor') return ['impostor', 'bad'];
  if (route.trust === 'announced' && state.status && state.status.trust !== 'lan') return ['untrusted', 'warn'];
  if (!route.verdict) return ['not probed yet', 'idle'];
  const known = VERDICTS[route.verdict] || [route.verdict, 'idle'];
  if (route.verdict === 'ready' && route.key_required && route.inference_ready === false) return ['needs a key', 'warn'];
  return known;
}

function remember(route) {
  const probe = route.last_probe;
  if (!probe || typeof probe.latency_ms !== 'number' || !probe.verdict || probe.verdict === 'down') return;
  const list = state.history.get(route.id) || [];
  if (list.length && list[list.length - 1].at === probe.at) return;
  list.push({ at: probe.at, ms: probe.latency_ms });
  while (list.length > HISTORY) list.shift();
  state.history.set(route.id, list);
}

function sparkline(route) {
  const points = state.history.get(route.id) || [];
  const NS = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', '0 0 100 24');
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('role', 'img');
  if (points.length < 2) {
    svg.setAttribute('aria-label', 'latency history: not enough probes yet');
    return svg;
  }
  const values = points.map((p) => p.ms);
  const max = Math.max(...values, 1);
  const line = document.createElementNS(NS, 'polyline');
  line.setAttribute('points', values.map((v, i) => (i * 100 / (values.length - 1)).toFixed(1) + ',' + (22 - v / max * 20).toFixed(1)).join(' '));
  svg.append(line);
  svg.setAttribute('aria-label', 'latency of the last ' + values.length + ' probes, ' + Math.min(...values).toFixed(1) + ' to ' + max.toFixed(1) + ' ms');
  return svg;
}

function renderNow() {
  const status = state.status;
  const now = $('now');
  if (!status) return;
  const active = status.active;
  if (active) {
    now.dataset.via = active.via;
    $('active-where').textContent = (active.via === 'lan' ? 'On the LAN: ' : 'Through the tunnel: ') + active.name;
    // Why here: on the tunnel, what keeps the LAN routes of that server from being used.
    const candidate = ((status.candidates) || []).find((c) => c.routes.some((r) => r.id === active.route_id));
    const lan = candidate ? candidate.routes.filter((r) => r.via === 'lan') : [];
    $('active-why').textContent = active.via === 'lan'
      ? 'Directly on the local network.'
      : (lan.length ? 'The LAN route is not usable: ' + lan.map((r) => r.reason).join('; ') : 'This server has no LAN route from here.');
    $('active-meta').textContent = active.base_url + ' · ' + (VERDICTS[active.verdict] || [active.verdict])[0] + ' since ' + when(active.since);
    $('active-findings').replaceChildren();
  } else {
    now.dataset.via = 'none';
    $('active-where').textContent = 'No server usable';
    $('active-why').textContent = status.no_active_reason || '';
    $('active-meta').textContent = '';
    // The agent's discovery checks: the cause found, in words, and the next step.
    $('active-findings').replaceChildren(...(status.discovery_findings || []).map((f) =>
      el('li', { className: 'finding', 'data-cause': f.cause },
        el('p', { text: f.says }),
        el('p', { className: 'next', text: 'Next: ' + f.next }))));
  }
  const gateway = status.gateway && status.gateway.openai_base_url ? 'Gateway: ' + status.gateway.openai_base_url + '. ' : '';
  const problem = status.gateway && status.gateway.problem ? 'Gateway: ' + status.gateway.problem + '. ' : '';
  $('active-meta').textContent += (active ? ' · ' : '') + gateway + problem + 'mDNS: ' + status.avahi + '. Trust: ' + (status.trust || 'paired') + '.';
}

// The last probe's detail, unless the route's reason already says it.
function detailOf(route) {
  const detail = route.last_probe && route.last_probe.detail;
  if (!detail || (route.reason || '').includes(detail)) return null;
  return detail;
}

function renderServers() {
  const box = $('servers');
  const candidates = (state.status && state.status.candidates) || [];
  if (!candidates.length) {
    box.replaceChildren(el('p', { className: 'empty', text: 'No server known yet: none announced on the LAN, none paired.' }));
    return;
  }
  box.replaceChildren(...candidates.map((candidate) => {
    const [word, tone] = candidate.verdict ? (VERDICTS[candidate.verdict] || [candidate.verdict, 'idle']) : ['not probed yet', 'idle'];
    const card = el('article', { className: 'card', 'data-active': String(candidate.active), 'aria-label': 'server ' + candidate.name },
      el('div', { className: 'card-head' },
        el('h3', { text: candidate.name }),
        candidate.active ? el('span', { className: 'badge', 'data-tone': 'ok', text: 'in use' }) : el('span', { className: 'badge', 'data-tone': tone, text: word })),
      candidate.instance_id ? el('p', { className: 'detail', text: 'instance ' + candidate.instance_id }) : null);
    const routes = el('ul', { className: 'routes' });
    for (const route of candidate.routes) {
      const [verdict, verdictTone] = verdictOf(route);
      const latency = route.last_probe && typeof route.last_probe.latency_ms === 'number' ? route.last_probe.latency_ms.toFixed(1) + ' ms' : '–';
      const load = typeof route.in_flight_requests === 'number' ? ' · load: ' + route.in_flight_requests + ' in flight' : '';
      // (No count when it is 0: the verdict says "no model loaded" already.)
      const models = route.loaded_models && route.loaded_models.length
        ? 'Models: ' + route.loaded_models.join(', ')
        : (typeof route.models === 'number' && route.models > 0 ? route.models + ' model' + (route.models === 1 ? '' : 's') + ' loaded' : null);
      // The cause code (docs/socket-api.md) for programs and a hover: the reason says it in words.
      routes.append(el('li', { className: 'route', 'data-route': route.id, 'data-verdict': verdict, 'data-cause': route.cause },
        el('div', { className: 'route-head' },
          el('span', { className: 'badge', 'data-tone': route.via === 'wan' ? 'wan' : 'idle', text: route.via === 'wan' ? 'tunnel' : 'LAN' }),
          el('span', { className: 'badge', 'data-tone': verdictTone, text: verdict }),
          route.active ? el('span', { className: 'badge', 'data-tone': 'ok', text: 'active' }) : null,
          el('span', { className: 'url', text: route.base_url })),
        // (Not "active" under the "active" badge.)
        route.reason && !(route.active && route.reason === 'active') ? el('p', { className: 'reason', text: route.reason, title: route.cause ? 'cause: ' + route.cause : null }) : null,
        el('div', { className: 'latency' }, (state.history.get(route.id) || []).length >= 2 ? sparkline(route) : null, el('span', { text: 'latency ' + latency + load })),
        models ? el('p', { className: 'models', text: models }) : null,
        route.found_by ? el('p', { className: 'detail found-by', text: 'Found by ' + route.found_by }) : null,
        detailOf(route) ? el('p', { className: 'detail', text: detailOf(route) }) : null));
    }
    card.append(routes);
    return card;
  }));
}

function renderTraffic(traffic) {
  const body = $('traffic').tBodies[0];
  const rows = (traffic && traffic.models) || [];
  if (!rows.length) {
    body.replaceChildren(el('tr', {}, el('td', { colSpan: 6, className: 'empty', text: 'No request through the gateway yet.' })));
    return;
  }
  const ms = (v) => (typeof v === 'number' ? v.toFixed(v < 10 ? 1 : 0) + ' ms' : '–');
  body.replaceChildren(...rows.map((row) => el('tr', {},
    el('td', { 'data-label': 'Model', text: row.model }),
    el('td', { 'data-label': 'Path', text: row.via === 'wan' ? 'tunnel' : 'LAN' }),
    el('td', { 'data-label': 'Requests', className: 'num', text: String(row.requests) }),
    el('td', { 'data-label': 'Errors', className: 'num', text: String(row.errors) }),
    el('td', { 'data-label': 'First token p50 / p95', className: 'num', text: ms(row.first_byte_p50_ms) + ' / ' + ms(row.first_byte_p95_ms) }),
    el('td', { 'data-label': 'Tokens/s', className: 'num', text: typeof row.events_per_second_p50 === 'number' ? row.events_per_second_p50.toFixed(1) : '–' }))));
}

function renderPairings(pairings) {
  const list = $('pairings');
  if (!pairings.length) {
    list.replaceChildren(el('li', { className: 'empty', text: 'No pairing. Pair with: lmx-pair pairing.png' }));
    return;
  }
  list.replaceChildren(...pairings.map((p) => {
    const expires = p.expires_at ? new Date(p.expires_at).getTime() : null;
    const left = expires === null ? null : expires - Date.now();
    const routes = (p.routes || []).map((r) => (r.verdict ? (VERDICTS[r.verdict] || [r.verdict])[0] : 'not probed yet')).join(', ');
    return el('li', {},
      el('strong', { text: p.name || p.id }), ' ',
      el('span', { className: 'url', text: p.url || p.lan || '' }),
      el('div', { className: 'detail', text: (p.secrets.length ? 'Keys: ' + p.secrets.join(', ') + ' (kept by the agent)' : 'No keys') + (routes ? ' · routes: ' + routes : '') }),
      el('div', {
        className: 'expiry', 'data-soon': String(left !== null && left >= 0 && left < 3 * 86400e3), 'data-expired': String(left !== null && left < 0),
        text: expires === null ? 'Does not expire' : (left < 0 ? 'Expired ' : 'Expires ') + relative(p.expires_at) + ' (' + new Date(p.expires_at).toLocaleString() + ')',
      }));
  }));
}

// An event of the history as a sentence: the agent's own words (`text`, the same as in its log
// and lmx-status); the kind and ids stay in the answer for programs.
function eventSentence(e) {
  if (typeof e.text === 'string' && e.text) return e.text;
  return e.kind + (e.reason ? ': ' + e.reason : '') + '.';
}

function renderEvents(events) {
  const list = $('events');
  if (!events.length) {
    list.replaceChildren(el('li', { className: 'empty', text: 'No event yet.' }));
    return;
  }
  const newest = events.slice().sort((a, b) => b.id - a.id);
  list.replaceChildren(...newest.map((e) => el('li', {},
    el('span', { className: 'seq', text: '#' + e.id }),
    el('time', { className: 'when', dateTime: e.at, text: when(e.at) }),
    el('span', { className: 'what', 'data-kind': e.kind, text: eventSentence(e) }))));
}

function render() {
  renderNow();
  renderServers();
  renderPaths();
}

// Coalesced reloads: many changes at once cost one request.
const pending = new Map();
function soon(name, ms, task) {
  if (pending.has(name)) return;
  pending.set(name, setTimeout(async () => {
    pending.delete(name);
    try { await task(); } catch (error) { /* the next change or tick tries again */ }
  }, ms));
}

async function loadStatus() {
  const status = await getJSON('/dashboard/api/status');
  state.status = status;
  for (const c of status.candidates) for (const r of c.routes) remember(r);
  render();
}
async function loadEvents() { renderEvents(await getJSON('/dashboard/api/events?limit=50')); }
async function loadPairings() { renderPairings(await getJSON('/dashboard/api/pairings')); }
async function loadTraffic() { renderTraffic(await getJSON('/dashboard/api/traffic')); }

function apply(line) {
  if (typeof line.seq === 'number') state.seq = line.seq;
  state.lastLine = Date.now();
  switch (line.type) {
    case 'snapshot':
      state.status = line.status;
      for (const c of state.status.candidates) for (const r of c.routes) remember(r);
      render();
      soon('events', 50, loadEvents);
      soon('pairings', 50, loadPairings);
      soon('traffic', 50, loadTraffic);
      return;
    case 'heartbeat':
      return;
    case 'active':
      if (state.status) {
        state.status.active = line.active || null;
        if (!line.active) state.status.no_active_reason = line.reason || state.status.no_active_reason;
        for (const c of state.status.candidates) {
          for (const r of c.routes) r.active = !!line.active && r.id === line.active.route_id;
          c.active = c.routes.some((r) => r.active);
        }
        render();
      }
      break;
    case 'health':
      if (line.route) {
        remember(line.route);
        for (const c of (state.status && state.status.candidates) || []) {
          const i = c.routes.findIndex((r) => r.id === line.route.id);
          if (i >= 0) c.routes[i] = line.route;
        }
        render();
      }
      break;
    case 'avahi':
      if (state.status) { state.status.avahi = line.avahi; renderNow(); }
      break;
    default:
      break;
  }
  // Reasons and merged servers follow from the whole status: fetched again, coalesced.
  soon('status', 250, loadStatus);
  soon('events', 500, loadEvents);
  // The ribbons gain the change (the agent records it as it happens).
  soon('history', 2000, loadHistory);
}

function setConnection(kind, text) {
  const node = $('connection');
  node.dataset.state = kind;
  node.textContent = text;
}

// Follows the change stream; after a break, resumes after the last line seen (the agent sends
// what was missed, or a fresh snapshot after a restart).
async function follow() {
  for (;;) {
    const controller = new AbortController();
    const watchdog = setInterval(() => { if (Date.now() - state.lastLine > 65000) controller.abort(); }, 5000);
    try {
      const path = '/dashboard/api/watch' + (state.seq === null ? '' : '?since=' + state.seq);
      const response = await fetch(path, { cache: 'no-store', credentials: 'omit', signal: controller.signal });
      if (!response.ok) throw new Error('HTTP ' + response.status);
      state.lastLine = Date.now();
      setConnection('live', 'Live');
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf('\n')) >= 0) {
          const text = buffer.slice(0, end);
          buffer = buffer.slice(end + 1);
          if (text) apply(JSON.parse(text));
        }
      }
    } catch (error) {
      // Reconnected below.
    } finally {
      clearInterval(watchdog);
    }
    setConnection('lost', 'Agent not answering; reconnecting…');
    await sleep(1000);
  }
}

// --- History: ribbons per route, figures per model, the paths now -------------------------
// Drawn as SVG by hand (no charting library: see docs/dashboard.md): a ribbon is a run of
// rectangles, a chart two polylines; every element is made with createElementNS and filled with
// textContent, so the page's CSP (no inline script or style) holds.
const NS = 'http://www.w3.org/2000/svg';
const RANGES = { '1h': 3600e3, '24h': 86400e3, '7d': 7 * 86400e3 };
const STATES = { 'ready': 'ready', 'not-ready': 'not ready', 'down': 'down', 'unknown': 'not probed yet', 'stopped': 'agent not running' };
const past = { range: '24h', data: null, loadedAt: 0 };

function svg(tag, attrs) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function span(ms) {
  const minutes = Math.round(ms / 60e3);
  if (minutes < 60) return minutes + ' min';
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return hours + ' h' + (minutes % 60 ? ' ' + (minutes % 60) + ' min' : '');
  return Math.floor(hours / 24) + ' d ' + (hours % 24) + ' h';
}

function stamp(ms, range) {
  const date = new Date(ms);
  return range === '7d'
    ? date.toLocaleDateString([], { weekday: 'short', day: 'numeric' }) + ' ' + date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })
    : date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

function segmentWords(route, s) {
  const from = Date.parse(s.from);
  const to = Date.parse(s.to);
  return (route.via === 'wan' ? 'tunnel' : 'LAN') + ': ' + (STATES[s.state] || s.state) + (s.active ? ', in use' : '') +
    ', ' + stamp(from, past.range) + ' to ' + stamp(to, past.range) + ' (' + span(to - from) + '). ' + (s.cause || '');
}

// One route's ribbon: a rectangle per segment (its state), a band above those in use, a mark at
// each switch. Focusable: arrow keys walk the segments, the pointer points at one; either way the
// segment's time and cause are told in the line under the server's ribbons.
function ribbon(route, since, until, switches, tell) {
  const width = until - since;
  const x = (ms) => ((ms - since) / width * 1000).toFixed(2);
  const box = svg('svg', { class: 'ribbon', viewBox: '0 0 1000 20', preserveAspectRatio: 'none', tabindex: '0', role: 'img' });
  const rects = [];
  for (const s of route.segments) {
    const from = Math.max(Date.parse(s.from), since);
    const to = Math.min(Date.parse(s.to), until);
    if (!(to > from)) continue;
    const w = Math.max(0.6, (to - from) / width * 1000).toFixed(2);
    const rect = svg('rect', { x: x(from), y: '6', width: w, height: '14', class: 'seg', 'data-state': s.state });
    box.append(rect);
    if (s.active) box.append(svg('rect', { x: x(from), y: '0', width: w, height: '4', class: 'in-use' }));
    rects.push({ rect, s });
  }
  for (const change of switches) {
    const at = Date.parse(change.at);
    if (at < since || at > until || (change.from !== route.id && change.to !== route.id)) continue;
    box.append(svg('line', { x1: x(at), x2: x(at), y1: '0', y2: '20', class: 'switch', 'data-at': change.at }));
  }
  const used = route.segments.filter((s) => s.active).length;
  box.setAttribute('aria-label', (route.via === 'wan' ? 'Tunnel' : 'LAN') + ' route over the last ' + past.range + ': ' +
    rects.length + ' stretch' + (rects.length === 1 ? '' : 'es') + ', ' + used + ' in use. Arrow keys step through them.');
  let current = -1;
  const show = (index) => {
    if (!rects.length) return;
    current = Math.max(0, Math.min(rects.length - 1, index));
    for (const [i, r] of rects.entries()) r.rect.classList.toggle('current', i === current);
    tell(segmentWords(route, rects[current].s));
  };
  box.addEventListener('keydown', (event) => {
    const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
    if (event.key === 'Home') show(0);
    else if (event.key === 'End') show(rects.length - 1);
    else if (event.key in moves) show(current < 0 ? rects.length - 1 : current + moves[event.key]);
    else return;
    event.preventDefault();
  });
  box.addEventListener('focus', () => { if (current < 0) show(rects.length - 1); else show(current); });
  box.addEventListener('pointermove', (event) => {
    const bounds = box.getBoundingClientRect();
    const at = since + (event.clientX - bounds.left) / bounds.width * width;
    const index = rects.findIndex((r) => Date.parse(r.s.from) <= at && at < Date.parse(r.s.to));
    if (index >= 0 && index !== current) show(index);
  });
  return box;
}

function axis(since, until) {
  const row = el('div', { className: 'axis', 'aria-hidden': 'true' });
  for (let i = 0; i <= 4; i++) row.append(el('span', { text: stamp(since + (until - since) * i / 4, past.range) }));
  return row;
}

function renderRibbons(data) {
  const box = $('ribbons');
  const since = Date.parse(data.since);
  const until = Date.parse(data.until);
  if (!data.routes.length) {
    box.replaceChildren(el('p', { className: 'empty', text: 'Nothing recorded in this window yet.' }));
    return;
  }
  // One block per server: routes sharing an instance, else a name.
  const servers = new Map();
  for (const route of data.routes) {
    const key = route.server || route.name;
    if (!servers.has(key)) servers.set(key, { name: route.name, routes: [] });
    servers.get(key).routes.push(route);
  }
  box.replaceChildren(...[...servers.values()].map((server) => {
    const told = el('p', { className: 'told', 'aria-live': 'polite', text: 'Point at a ribbon, or focus it and use the arrow keys.' });
    const tell = (text) => { told.textContent = text; };
    const rows = server.routes.sort((a, b) => a.via.localeCompare(b.via)).map((route) => el('div', { className: 'ribbon-row', 'data-route': route.id },
      el('span', { className: 'badge', 'data-tone': route.via === 'wan' ? 'wan' : 'idle', text: route.via === 'wan' ? 'tunnel' : 'LAN' }),
      ribbon(route, since, until, data.switches, tell)));
    return el('article', { className: 'card history-card', 'aria-label': 'history of ' + server.name },
      el('h3', { text: server.name }), ...rows, axis(since, until), told);
  }));
}

// A small line chart of `key` over time, the LAN and the tunnel side by side.
function chart(title, unit, series, key, since, until) {
  const lines = series.map((s) => ({ via: s.via, points: s.points.filter((p) => typeof p[key] === 'number').map((p) => [Date.parse(p.at), p[key]]) }));
  const max = Math.max(1, ...lines.flatMap((l) => l.points.map((p) => p[1])));
  const box = svg('svg', { class: 'chart', viewBox: '0 0 300 80', preserveAspectRatio: 'none', role: 'img' });
  box.append(svg('line', { x1: '0', x2: '300', y1: '79', y2: '79', class: 'base' }));
  const words = [];
  for (const line of lines) {
    if (!line.points.length) continue;
    const pts = line.points.map(([t, v]) => ((t - since) / (until - since) * 300).toFixed(1) + ',' + (78 - v / max * 72).toFixed(1));
    if (pts.length === 1) pts.push(pts[0].replace(/^[^,]*/, (n) => String(Number(n) + 2)));
    box.append(svg('polyline', { points: pts.join(' '), class: 'series', 'data-via': line.via }));
    const values = line.points.map((p) => p[1]);
    words.push((line.via === 'wan' ? 'tunnel' : 'LAN') + ' ' + Math.min(...values).toFixed(0) + ' to ' + Math.max(...values).toFixed(0) + ' ' + unit);
  }
  box.setAttribute('aria-label', title + ': ' + (words.join('; ') || 'no figures'));
  return el('figure', { className: 'chart-box' },
    el('figcaption', { text: title + ' (up to ' + max.toFixed(max < 10 ? 1 : 0) + ' ' + unit + ')' }), box);
}

function renderCharts(data) {
  const box = $('charts');
  const since = Date.parse(data.since);
  const until = Date.parse(data.until);
  const byModel = new Map();
  for (const m of data.models) {
    if (!byModel.has(m.model)) byModel.set(m.model, []);
    byModel.get(m.model).push(m);
  }
  if (!byModel.size) {
    box.replaceChildren(el('p', { className: 'empty', text: 'No request through the gateway in this window.' }));
    return;
  }
  box.replaceChildren(...[...byModel.entries()].map(([model, series]) => el('article', { className: 'card model-card' },
    el('h3', { text: model }),
    el('p', { className: 'legend' }, el('span', { className: 'key', 'data-via': 'lan', text: 'LAN' }), ' ', el('span', { className: 'key', 'data-via': 'wan', text: 'tunnel' })),
    el('div', { className: 'chart-pair' },
      chart('First token, median', 'ms', series, 'first_token_p50_ms', since, until),
      chart('Tokens per second', 'tok/s', series, 'tokens_per_second', since, until)))));
}

// The paths now: this machine, the LAN or the tunnel, each server; the one in use drawn as such.
function renderPaths() {
  const box = $('paths');
  const candidates = (state.status && state.status.candidates) || [];
  if (!candidates.length) {
    box.replaceChildren(el('p', { className: 'empty', text: 'No server known yet.' }));
    return;
  }
  const rowHeight = 56;
  const height = candidates.length * rowHeight + 8;
  const picture = svg('svg', { class: 'paths', viewBox: '0 0 360 ' + height, role: 'img' });
  const words = [];
  const machine = svg('g', { class: 'node machine' });
  machine.append(svg('rect', { x: '4', y: String(height / 2 - 14), width: '86', height: '28', rx: '6' }));
  const me = svg('text', { x: '47', y: String(height / 2 + 4), 'text-anchor': 'middle' });
  me.textContent = 'this machine';
  machine.append(me);
  picture.append(machine);
  candidates.forEach((c, i) => {
    const y = 8 + i * rowHeight + rowHeight / 2 - 4;
    for (const route of c.routes) {
      const [word, tone] = verdictOf(route);
      const bend = route.via === 'wan' ? 14 : -14;
      const path = svg('path', {
        d: 'M90 ' + height / 2 + ' C 170 ' + (height / 2 + bend) + ', 190 ' + (y + bend) + ', 250 ' + y,
        class: 'link', 'data-via': route.via, 'data-tone': tone, 'data-active': String(!!route.active),
      });
      picture.append(path);
      words.push(c.name + (route.via === 'wan' ? ' through the tunnel' : ' on the LAN') + ': ' + word + (route.active ? ', in use' : ''));
    }
    const node = svg('g', { class: 'node server', 'data-active': String(!!c.active) });
    node.append(svg('rect', { x: '250', y: String(y - 14), width: '106', height: '28', rx: '6' }));
    const name = svg('text', { x: '303', y: String(y + 4), 'text-anchor': 'middle' });
    name.textContent = c.name.length > 16 ? c.name.slice(0, 15) + '…' : c.name;
    node.append(name);
    picture.append(node);
  });
  picture.setAttribute('aria-label', 'Paths from this machine: ' + words.join('; ') + '.');
  box.replaceChildren(picture, el('p', { className: 'legend' },
    el('span', { className: 'key', 'data-via': 'lan', text: 'LAN' }), ' ', el('span', { className: 'key', 'data-via': 'wan', text: 'tunnel' }),
    ' · thick: in use · dashed: not usable'));
}

async function loadHistory() {
  const started = performance.now();
  const data = await getJSON('/dashboard/api/history?since=' + past.range);
  past.data = data;
  past.loadedAt = Date.now();
  renderRibbons(data);
  renderCharts(data);
  const section = $('history');
  section.dataset.range = past.range;
  // (Read by the tests: how long fetching and drawing took, and when it was done.)
  section.dataset.drawnMs = (performance.now() - started).toFixed(1);
  section.dataset.drawnAt = performance.now().toFixed(1);
  section.dataset.loaded = String(past.loadedAt);
}

function setupHistory() {
  for (const button of document.querySelectorAll('#ranges button')) {
    button.addEventListener('click', () => {
      past.range = button.dataset.range;
      for (const b of document.querySelectorAll('#ranges button')) b.setAttribute('aria-pressed', String(b === button));
      soon('history', 0, loadHistory);
    });
  }
  soon('history', 0, loadHistory);
  setInterval(() => soon('history', 0, loadHistory), 60000);
}

document.addEventListener('DOMContentLoaded', () => {
  follow();
  setupHistory();
  setInterval(() => soon('traffic', 0, loadTraffic), 5000);
  setInterval(() => soon('pairings', 0, loadPairings), 60000);
});
