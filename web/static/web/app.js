// Switchboard web app: live conversations, drafts that survive, the inbox count.
// Plain JavaScript and the browser's WebSocket; htmx does the rest.
(() => {
  "use strict";

  const csrfToken = () => document.querySelector('meta[name="csrf-token"]').content;

  // A socket that reconnects with backoff (0.5 s doubling to 10 s). A close
  // with an application code (4401 signed out, 4403 no access, 4409 too far
  // behind) is final: no reconnecting.
  // A connection that went away without a close (a network gone, a laptop
  // asleep, a NAT that forgot it) still looks open: nothing arrives and
  // nothing fails. The server speaks at least every `live-heartbeat`
  // seconds, so a socket silent for 2.5 times that is given up and
  // replaced; the browser going offline gives it up at once.
  const heartbeat = 1000 * Number(document.querySelector('meta[name="live-heartbeat"]')?.content || 25);
  function liveSocket(path, { params, onFrame, onState }) {
    let delay = 500;
    let stopped = false;
    let socket = null;
    let retry = null;
    let heard = 0;
    const open = () => {
      clearTimeout(retry);
      heard = Date.now();
      const url = new URL(path, location.href);
      url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
      for (const [name, value] of Object.entries(params())) url.searchParams.set(name, value);
      let opened = false;
      socket = new WebSocket(url);
      socket.onopen = () => { opened = true; delay = 500; };
      socket.onmessage = (event) => {
        heard = Date.now();
        const frame = JSON.parse(event.data);
        if (frame.type !== "heartbeat") onFrame(frame);
      };
      socket.onclose = (event) => {
        if (stopped) return;
        if (opened && event.code >= 4400 && event.code < 4500) { stopped = true; onState(event.code); return; }
        onState("reconnecting");
        retry = setTimeout(open, delay);
        delay = Math.min(delay * 2, 10000);
      };
    };
    const giveUp = () => {  // closed as if by the network: reconnecting, with backoff
      const closed = socket.onclose;
      socket.onclose = socket.onmessage = null;
      socket.close();
      closed({ code: 1006 });
    };
    setInterval(() => {
      if (!stopped && socket.readyState === WebSocket.OPEN && Date.now() - heard > 2.5 * heartbeat) giveUp();
    }, Math.min(heartbeat, 5000));
    window.addEventListener("offline", () => { if (!stopped && socket.readyState === WebSocket.OPEN) giveUp(); });
    window.addEventListener("online", () => {
      if (!stopped && socket.readyState !== WebSocket.OPEN && socket.readyState !== WebSocket.CONNECTING) {
        delay = 500;
        open();
      }
    });
    open();
    return { drop: () => socket.close(), get socket() { return socket; } };
  }

  const live = (window.switchboard = {});

  // Drafts are kept in this browser per member, and forgotten when they
  // sign out: the next person to use it must not find them.
  const DRAFTS = "switchboard:draft:";
  const signOut = document.querySelector('form[action$="/logout/"]');
  if (signOut) {
    signOut.addEventListener("submit", () => {
      for (const name of Object.keys(localStorage)) if (name.startsWith(DRAFTS)) localStorage.removeItem(name);
    });
  }

  // Forms whose action cannot be undone ask first (`data-confirm`), before
  // anything else hears the submit.
  document.addEventListener("submit", (event) => {
    const question = event.target.dataset?.confirm;
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);

  // --- the inbox count in the header, on every page --------------------------
  const badge = document.getElementById("inbox-count");
  if (badge) {
    let heard = false;  // a frame since the page was made
    live.inbox = liveSocket("/ws/inbox/", {
      params: () => ({}),
      onFrame(frame) {
        if (frame.type !== "inbox") return;
        const current = document.getElementById("inbox-count");
        // The first frame tells the count as the page was just made, almost
        // always: the inbox list is read again only if it differs. (Read
        // again every time, it replaced the list under a keyboard already at
        // work, and an Enter on a button htmx had yet to take up posted the
        // form as a page.)
        const changed = heard || current.textContent.trim() !== String(frame.pending);
        heard = true;
        current.textContent = frame.pending;
        current.setAttribute("aria-label", `${frame.pending} pending`);
        if (changed) document.body.dispatchEvent(new CustomEvent("inbox-changed"));
      },
      onState() {},
    });
  }

  // --- the subscriptions page: statuses and attempts, every 2 s --------------
  // A `refresh` htmx hears, while the page is seen and none of its forms is
  // being filled in (an hx-trigger filter would need eval, which the pages'
  // Content-Security-Policy refuses).
  if (document.getElementById("subscriptions")) {
    setInterval(() => {
      const section = document.getElementById("subscriptions");  // swapped whole each time
      const editing = document.activeElement && document.activeElement.closest("#subscriptions form");
      if (section && document.visibilityState === "visible" && !editing) window.htmx.trigger(section, "refresh");
    }, 2000);
  }

  // --- the inbox: the keyboard's place survives items going ------------------
  // An acknowledged item is deleted with its button, and a live refresh
  // replaces them all: when focus falls from the list to the page, it goes
  // back to the same item's button, else the next item's, else the one
  // before (else the heading). It was moved before each swap, from what that
  // swap alone would do: a refresh and the acknowledgement's own answer in
  // the other order left it on the page.
  const items = document.getElementById("inbox-items");
  if (items) {
    let place = [];  // where the keyboard is in the list: its item's id, the next's, the previous's
    items.addEventListener("focusin", (event) => {
      const item = event.target.closest("li.item");
      if (item) place = [item.id, item.nextElementSibling?.id, item.previousElementSibling?.id].filter(Boolean);
    });
    document.addEventListener("pointerdown", (event) => { if (!items.contains(event.target)) place = []; });
    new MutationObserver(() => setTimeout(() => {  // once htmx has taken up what it swapped in
      if (!place.length || (document.activeElement && document.activeElement !== document.body)) return;
      const item = place.map((id) => document.getElementById(id))
        .find((element) => element && element.classList.contains("item"));
      (item ? item.querySelector("button") : document.getElementById("inbox-title"))?.focus();
    }, 0)).observe(items, { childList: true, subtree: true });
  }

  // --- a conversation -----------------------------------------------------------
  const page = document.getElementById("conversation");
  if (!page) return;
  const id = page.dataset.conversation;
  const log = document.getElementById("log");
  const list = document.getElementById("messages");
  const marker = document.getElementById("new-marker");
  const status = document.getElementById("live-status");
  const nearBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 48;
  log.scrollTop = log.scrollHeight;

  const setStatus = (text, cls) => { status.textContent = text; status.className = `live-status ${cls}`; };

  // Insert a rendered message in position order; false if it is already shown.
  function insert(row) {
    if (document.getElementById(`m-${row.position}`)) return false;
    const template = document.createElement("template");
    template.innerHTML = row.html.trim();
    let before = list.lastElementChild;
    while (before && Number(before.dataset.position) > row.position) before = before.previousElementSibling;
    list.insertBefore(template.content.firstElementChild, before ? before.nextSibling : list.firstChild);
    document.getElementById("empty")?.remove();
    return true;
  }

  // New messages: a reader at the bottom follows them; a reader scrolled up
  // stays where they are and gets the marker instead.
  function receive(rows, own) {
    const follow = own || nearBottom();
    let added = false;
    for (const row of rows) added = insert(row) || added;
    if (!added) return;
    if (follow) log.scrollTop = log.scrollHeight;
    else marker.hidden = false;
  }
  marker.addEventListener("click", () => { log.scrollTop = log.scrollHeight; marker.hidden = true; log.focus(); });
  log.addEventListener("scroll", () => { if (nearBottom()) marker.hidden = true; });

  // Bodies shown whose grant was revoked since: withheld in place, as a
  // reload would show them. The stream says so when a grant's barrier
  // starts; after a reconnect the page asks anyway (it may have missed it).
  async function showWithheld() {
    const first = list.querySelector("li.msg");
    if (!first) return;
    const response = await fetch(`${page.dataset.history}?withheld_from=${first.dataset.position}`,
                                 { headers: { Accept: "application/json" } });
    if (!response.ok) return;
    for (const row of (await response.json()).rows) {
      const template = document.createElement("template");
      template.innerHTML = row.html.trim();
      document.getElementById(`m-${row.position}`)?.replaceWith(template.content.firstElementChild);
    }
  }

  // The stream continues after the newest message this page has from it, so a
  // reconnect backfills exactly what was missed (the composer's own answers
  // are shown at once but do not move this position).
  if (page.dataset.after !== "") {
    let streamPosition = Number(page.dataset.after);
    let reconnected = false;
    live.conversation = liveSocket(`/ws/conversations/${id}/`, {
      params: () => ({ after: streamPosition }),
      onFrame(frame) {
        if (frame.type === "message") {
          receive([frame], false);
          streamPosition = frame.position;
        } else if (frame.type === "withheld") {
          showWithheld();
        } else if (frame.type === "live") {
          setStatus("Live", "live");
          if (reconnected && "withholds" in page.dataset) showWithheld();
          reconnected = true;
        }
      },
      onState(state) {
        if (state === 4409) {
          location.reload(); // too far behind to replay: the page itself is the catch-up (the draft is kept)
        } else if (state === 4401 || state === 4403) {
          setStatus(state === 4401 ? "Signed out: sign in again to see new messages."
                                   : "You no longer have access to this conversation.", "down");
          document.querySelectorAll("#composer textarea, #composer button").forEach((el) => { el.disabled = true; });
        } else {
          setStatus("Reconnecting…", "down");
        }
      },
    });
  }

  // Older history, paged upward, keeping the reader's place.
  const older = document.getElementById("older");
  older?.addEventListener("click", async (event) => {
    event.preventDefault();
    const first = list.firstElementChild;
    const response = await fetch(`${page.dataset.history}?before=${first.dataset.position}`,
                                 { headers: { Accept: "application/json" } });
    if (!response.ok) return;
    const data = await response.json();
    const height = log.scrollHeight;
    const top = log.scrollTop;
    data.rows.forEach(insert);
    log.scrollTop = top + (log.scrollHeight - height);
    if (!data.more) older.remove();
  });

  // --- the composer: drafts kept per conversation until sent ----------------------
  const form = document.getElementById("composer");
  if (!form) return;
  const body = form.elements.body;
  const key = form.elements.idempotency_key;
  const errorBox = document.getElementById("composer-error");
  // One draft per tab (sessionStorage keeps the tab's name across reloads):
  // two tabs of a conversation wrote one draft, and a send in one deleted
  // the other's. A new tab takes up the newest draft a tab left, which a
  // send of the same text ends too.
  const TAB = "switchboard:tab";
  if (!sessionStorage.getItem(TAB)) sessionStorage.setItem(TAB, crypto.randomUUID());
  const conversationDrafts = `${DRAFTS}${document.querySelector('meta[name="member"]').content}:${id}:`;
  const draftName = conversationDrafts + sessionStorage.getItem(TAB);
  const draftsLeft = () => Object.keys(localStorage).filter((name) => name.startsWith(conversationDrafts))
    .map((name) => ({ name, ...JSON.parse(localStorage.getItem(name) || "{}") }));
  const newKey = () => {
    const bytes = crypto.getRandomValues(new Uint8Array(18));
    return "web-" + btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_");
  };
  // The key belongs to the text it was first sent with: a retry of the same
  // text is the same send; edited text is a new one.
  let attempted = null;
  const saveDraft = () => {
    if (body.value) {
      localStorage.setItem(draftName, JSON.stringify({ body: body.value, key: key.value, attempted, at: Date.now() }));
    } else {
      localStorage.removeItem(draftName);
    }
  };
  const forgetSent = (value) => {
    for (const draft of draftsLeft()) if (draft.name === draftName || draft.body === value) localStorage.removeItem(draft.name);
  };
  const saved = JSON.parse(localStorage.getItem(draftName) || "null")
    || draftsLeft().sort((a, b) => (b.at || 0) - (a.at || 0))[0];
  if (saved && !body.value) {
    body.value = saved.body;
    key.value = saved.key;
    attempted = saved.attempted ?? null;
  }
  body.addEventListener("input", () => {
    if (attempted !== null && body.value !== attempted) { key.value = newKey(); attempted = null; }
    saveDraft();
    show("");  // what the last send was told is about text that changed
  });

  const show = (html) => { errorBox.innerHTML = html; };
  const text = (value) => { const p = document.createElement("span"); p.textContent = value; return p.innerHTML; };

  async function send(requestApproval) {
    const value = body.value;
    show("");
    if (!value.trim()) return;
    attempted = value;
    saveDraft();
    let response;
    try {
      response = await fetch(form.action, {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify({ body: value, idempotency_key: key.value, request_approval: requestApproval }),
      });
    } catch {
      show('<p class="error">Could not reach the server. Your draft is kept; send again when you are back online.</p>');
      return;
    }
    const data = await response.json().catch(() => null);
    const error = data && data.error;
    const sentOrRetained = response.ok || (error && error.code === "GRANT_REQUIRED" && error.details.approval_request);
    if (sentOrRetained) {
      forgetSent(value);
      if (body.value === value) body.value = "";
      key.value = newKey();
      attempted = null;
      saveDraft();
    }
    if (response.ok) {
      show("");
      receive([data.message], true);
    } else if (sentOrRetained) {
      show(`<p class="notice">Sent to an admin for approval (${text(error.details.approval_request.id)}). ` +
           "It appears here once approved.</p>");
    } else if (error && error.code === "GRANT_REQUIRED") {
      const who = (error.details.recipients || []).join(", ");
      show(`<p class="error"><strong>${text(error.message)}</strong> No grant covers ${text(who)}.</p>` +
           '<button type="button" id="request-approval">Request approval</button>');
      document.getElementById("request-approval").addEventListener("click", () => send(true));
    } else if (error && error.code === "UNAUTHENTICATED") {
      show('<p class="error">Your session ended. <a href="/app/login/">Sign in again</a>; your draft is kept.</p>');
    } else {
      show(`<p class="error"><strong>${text(error ? error.message : `The server answered ${response.status}.`)}</strong>` +
           `${error ? ` <span class="code">(${text(error.code)})</span>` : ""}</p>`);
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    send(event.submitter?.name === "request_approval");
  });
  body.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); send(false); }
  });
})();
