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
  const problem = status.gateway && status.gateway.problem ? 'Gateway not on TCP: ' + status.gateway.problem + '. ' : '';
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
      routes.append(el('li', { className: 'route', 'data-route': route.id, 'data-verdict': verdict },
        el('div', { className: 'route-head' },
          el('span', { className: 'badge', 'data-tone': route.via === 'wan' ? 'wan' : 'idle', text: route.via === 'wan' ? 'tunnel' : 'LAN' }),
          el('span', { className: 'badge', 'data-tone': verdictTone, text: verdict }),
          route.active ? el('span', { className: 'badge', 'data-tone': 'ok', text: 'active' }) : null,
          el('span', { className: 'url', text: route.base_url })),
        // (Not "active" under the "active" badge.)
        route.reason && !(route.active && route.reason === 'active') ? el('p', { className: 'reason', text: route.reason }) : null,
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
    el('td', { text: row.model }),
    el('td', { text: row.via === 'wan' ? 'tunnel' : 'LAN' }),
    el('td', { className: 'num', text: String(row.requests) }),
    el('td', { className: 'num', text: String(row.errors) }),
    el('td', { className: 'num', text: ms(row.first_byte_p50_ms) + ' / ' + ms(row.first_byte_p95_ms) }),
    el('td', { className: 'num', text: typeof row.events_per_second_p50 === 'number' ? row.events_per_second_p50.toFixed(1) : '–' }))));
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

document.addEventListener('DOMContentLoaded', () => {
  follow();
  setInterval(() => soon('traffic', 0, loadTraffic), 5000);
  setInterval(() => soon('pairings', 0, loadPairings), 60000);
});
