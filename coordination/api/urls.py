from django.urls import path

from coordination.api import views

urlpatterns = [
    path("spaces/<space:slug>/tasks", views.TasksView.as_view()),
    path("spaces/<space:slug>/tasks/<pid:task_id>", views.TaskView.as_view()),
    *(path(f"spaces/<space:slug>/tasks/<pid:task_id>/{action}", views.TaskActionView.as_view(action=action))
      for action in views.TaskActionView.ACTIONS),
]
