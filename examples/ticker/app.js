// The ticker: one HeraldClient, one subscription, every message shown with
// its seq; resumes, resets and reconnects shown as they happen.
import { HeraldClient } from '../../clients/js/dist/index.js';

const params = new URLSearchParams(location.search);
const url = params.get('ws') ?? `ws://${location.hostname}:8080/ws`;
const $ = (id) => document.getElementById(id);
const time = () => new Date().toLocaleTimeString();

function log(text, kind = '') {
  const li = document.createElement('li');
  li.className = kind;
  li.textContent = `${time()}  ${text}`;
  $('log').prepend(li);
}

const client = new HeraldClient({ urls: url });
client.on('state', (s) => {
  $('state').textContent = s.state;
  $('state').className = `state ${s.state}`;
  if (s.state === 'connected') log(s.resumed ? `resumed session ${s.session.slice(0, 8)}…` : `new session ${s.session.slice(0, 8)}…`, s.resumed ? 'resume' : '');
  if (s.state === 'disconnected') log(`disconnected (close ${s.closeCode}); back in ${s.delayMs} ms`, 'warn');
  if (s.state === 'closed' && s.error) log(`closed for good: ${s.error.message}`, 'warn');
});
client.on('error', (e) => log(`error ${e.code}: ${e.message}`, 'warn'));

const ticker = client.subscribe('ticker');
ticker.on('subscribed', (s) => log(`${s.resumed ? 'restored' : 'subscribed'} after seq ${s.seq} (epoch ${s.epoch?.slice(0, 8)})`));
ticker.on('reset', (r) => log(`reset: new epoch ${r.epoch?.slice(0, 8)}, live after seq ${r.seq}`, 'reset'));
ticker.on('message', (m) => {
  const row = document.createElement('tr');
  for (const text of [m.seq, m.epoch?.slice(0, 8), m.data?.price ?? JSON.stringify(m.data), time()]) {
    const td = document.createElement('td');
    td.textContent = String(text);
    row.append(td);
  }
  $('messages').prepend(row);
  while ($('messages').rows.length > 15) $('messages').deleteRow(-1);
  $('state').dataset.duplicates = String(ticker.duplicates);
});

$('drop').addEventListener('click', () => {
  log('dropped by the button', 'warn');
  client.close();
  setTimeout(() => client.connect().catch(() => {}), 1500);
});

client.connect().catch(() => {});
window.ticker = { client, sub: ticker };
