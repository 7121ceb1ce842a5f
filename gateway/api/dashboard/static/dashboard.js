// Live progress: poll the page's JSON endpoint and swap in the cards the server rendered.
// Every second while a batch on the page is running, every five seconds otherwise (to notice new batches).
(function () {
  "use strict";
  var list = document.getElementById("batches");
  if (!list) return;
  var empty = document.getElementById("empty");
  var live = document.getElementById("live");
  var FAST = 1000, SLOW = 5000;

  function cards() {
    var found = {};
    list.querySelectorAll(".batch").forEach(function (el) { found[el.dataset.id] = el; });
    return found;
  }

  function fromHtml(html) {
    var holder = document.createElement("template");
    holder.innerHTML = html.trim();  // rendered and escaped by the server
    return holder.content.firstElementChild;
  }

  function apply(data) {
    var shown = cards();
    var next = [];
    for (var i = 0; i < data.ids.length; i++) {
      var id = data.ids[i];
      var html = data.cards[id];
      var el = html ? fromHtml(html) : shown[id];
      if (!el) { location.reload(); return false; }  // cannot happen (unknown ids come rendered); be safe
      next.push(el);
    }
    list.replaceChildren.apply(list, next);
    empty.hidden = next.length > 0;
    return next.some(function (el) { return el.dataset.finished !== "1"; });
  }

  function tick() {
    // Finished cards never change again: only the others are sent back rendered.
    var finished = Array.prototype.filter.call(list.querySelectorAll(".batch"), function (el) {
      return el.dataset.finished === "1";
    }).map(function (el) { return el.dataset.id; });
    var url = list.dataset.poll + (finished.length ? "&done=" + encodeURIComponent(finished.join(",")) : "");
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (reply) {
        if (reply.status === 401) { location.assign(list.dataset.login); throw new Error("logged out"); }
        if (!reply.ok) throw new Error("HTTP " + reply.status);
        return reply.json();
      })
      .then(function (data) {
        var busy = apply(data);
        live.textContent = (busy ? "live · " : "") + "updated " + new Date().toLocaleTimeString();
        setTimeout(tick, busy ? FAST : SLOW);
      })
      .catch(function (err) {
        live.textContent = "not updating (" + err.message + "), retrying";
        setTimeout(tick, SLOW);
      });
  }

  setTimeout(tick, list.querySelector('.batch[data-finished="0"]') ? FAST : SLOW);
})();
