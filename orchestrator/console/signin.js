/* The sign-in and confirming pages: the view the person was on is kept through the sign-in.
 *
 * The console's views live in the address's fragment (#/task/ID), which a browser never sends.
 * A link to a task's page opened without a session, or a page whose session ended (signed out
 * elsewhere, its 12 hours over), showed this form at /console#/task/ID; the form posted to
 * console/session and its answer redirected to /console, so the person landed on the task
 * list, their place lost. The fragment is put on the form's action: a redirect whose address
 * has none keeps the request's (RFC 9110, 10.2.2), so the answer lands on the same view.
 */
"use strict";

(function () {
  if (!location.hash) return;
  for (const form of document.querySelectorAll("form[method=post]")) {
    const action = new URL(form.getAttribute("action"), location.href);
    action.hash = location.hash;
    form.action = action.href;
  }
})();
