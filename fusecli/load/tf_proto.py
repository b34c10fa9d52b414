"""The part of TensorFlow's SavedModel protobuf schema that fusecli reads, built without TensorFlow.

No package short of TensorFlow ships ``saved_model_pb2`` (tensorboard ships the graph protos, but with
grpcio, werkzeug and more behind it), so this module declares the messages itself: the same field
numbers and wire types as TensorFlow's ``.proto`` files (tensorflow/core/protobuf/saved_model.proto,
meta_graph.proto, saved_object_graph.proto; tensorflow/core/framework/graph.proto, node_def.proto,
function.proto, op_def.proto, attr_value.proto, tensor.proto, tensor_shape.proto), with only the fields
fusecli reads. Fields left out are skipped by the parser as unknown fields. Enum fields (``DataType``)
are declared ``int32``: the same varint on the wire. tests/load/test_savedmodel.py checks every field
here against TensorFlow's own descriptors.

The messages live in a private descriptor pool under the package ``fusecli.tf``, so they never clash
with TensorFlow's own classes when both are loaded in one process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "fusecli.tf"
_F = descriptor_pb2.FieldDescriptorProto

# message -> [(field, number, type, repeated)]; a type is a scalar name, a message name or
# "map<key,value>" (a map of a scalar key to a scalar or a message).
_SCHEMA: dict[str, list[tuple[str, int, str, bool]]] = {
    "SavedModel": [("saved_model_schema_version", 1, "int64", False),
                   ("meta_graphs", 2, "MetaGraphDef", True)],
    "MetaGraphDef": [("meta_info_def", 1, "MetaInfoDef", False), ("graph_def", 2, "GraphDef", False),
                     ("signature_def", 5, "map<string,SignatureDef>", False),
                     ("object_graph_def", 7, "SavedObjectGraph", False)],
    "MetaInfoDef": [("meta_graph_version", 1, "string", False), ("stripped_op_list", 2, "OpList", False),
                    ("tags", 4, "string", True), ("tensorflow_version", 5, "string", False)],
    "OpList": [("op", 1, "OpDef", True)],
    "OpDef": [("name", 1, "string", False), ("input_arg", 2, "ArgDef", True),
              ("output_arg", 3, "ArgDef", True), ("attr", 4, "AttrDef", True)],
    "ArgDef": [("name", 1, "string", False), ("type", 3, "int32", False), ("type_attr", 4, "string", False),
               ("number_attr", 5, "string", False), ("type_list_attr", 6, "string", False),
               ("is_ref", 16, "bool", False)],
    "AttrDef": [("name", 1, "string", False), ("type", 2, "string", False),
                ("default_value", 3, "AttrValue", False)],
    "GraphDef": [("node", 1, "NodeDef", True), ("library", 2, "FunctionDefLibrary", False)],
    "NodeDef": [("name", 1, "string", False), ("op", 2, "string", False), ("input", 3, "string", True),
                ("attr", 5, "map<string,AttrValue>", False)],
    "FunctionDefLibrary": [("function", 1, "FunctionDef", True),
                           ("registered_gradients", 3, "RegisteredGradient", True)],
    "RegisteredGradient": [("gradient_func", 1, "string", False), ("registered_op_type", 2, "string", False)],
    "FunctionDef": [("signature", 1, "OpDef", False), ("node_def", 3, "NodeDef", True),
                    ("ret", 4, "map<string,string>", False), ("arg_attr", 7, "map<uint32,ArgAttrs>", False)],
    "ArgAttrs": [("attr", 1, "map<string,AttrValue>", False)],
    "AttrValue": [("list", 1, "ListValue", False), ("s", 2, "bytes", False), ("i", 3, "int64", False),
                  ("f", 4, "float", False), ("b", 5, "bool", False), ("type", 6, "int32", False),
                  ("shape", 7, "TensorShapeProto", False), ("tensor", 8, "TensorProto", False),
                  ("placeholder", 9, "string", False), ("func", 10, "NameAttrList", False)],
    "ListValue": [("s", 2, "bytes", True), ("i", 3, "int64", True), ("f", 4, "float", True),
                  ("b", 5, "bool", True), ("type", 6, "int32", True), ("shape", 7, "TensorShapeProto", True),
                  ("tensor", 8, "TensorProto", True), ("func", 9, "NameAttrList", True)],
    "NameAttrList": [("name", 1, "string", False), ("attr", 2, "map<string,AttrValue>", False)],
    "TensorShapeProto": [("dim", 2, "Dim", True), ("unknown_rank", 3, "bool", False)],
    "Dim": [("size", 1, "int64", False), ("name", 2, "string", False)],
    "TensorProto": [("dtype", 1, "int32", False), ("tensor_shape", 2, "TensorShapeProto", False),
                    ("tensor_content", 4, "bytes", False), ("float_val", 5, "float", True),
                    ("double_val", 6, "double", True), ("int_val", 7, "int32", True),
                    ("string_val", 8, "bytes", True), ("int64_val", 10, "int64", True),
                    ("bool_val", 11, "bool", True), ("half_val", 13, "int32", True),
                    ("uint32_val", 16, "uint32", True), ("uint64_val", 17, "uint64", True)],
    "SignatureDef": [("inputs", 1, "map<string,TensorInfo>", False),
                     ("outputs", 2, "map<string,TensorInfo>", False), ("method_name", 3, "string", False)],
    "TensorInfo": [("name", 1, "string", False), ("dtype", 2, "int32", False),
                   ("tensor_shape", 3, "TensorShapeProto", False)],
    "SavedObjectGraph": [("nodes", 1, "SavedObject", True),
                         ("concrete_functions", 2, "map<string,SavedConcreteFunction>", False)],
    "SavedObject": [("variable", 7, "SavedVariable", False)],
    "SavedVariable": [("dtype", 1, "int32", False), ("shape", 2, "TensorShapeProto", False),
                      ("trainable", 3, "bool", False), ("name", 6, "string", False)],
    "SavedConcreteFunction": [("bound_inputs", 2, "int32", True)],
}

# Messages whose fields all belong to one oneof (AttrValue's ``value``: which kind of value it holds).
_ONEOFS = {"AttrValue": "value"}

# Where a message above sits in TensorFlow (the test compares against these descriptors).
TF_NAMES = {"Dim": "TensorShapeProto.Dim", "ArgDef": "OpDef.ArgDef", "AttrDef": "OpDef.AttrDef",
            "ListValue": "AttrValue.ListValue", "ArgAttrs": "FunctionDef.ArgAttrs",
            "MetaInfoDef": "MetaGraphDef.MetaInfoDef"}
SCHEMA = _SCHEMA

_SCALARS = {"int64": _F.TYPE_INT64, "int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32,
            "uint64": _F.TYPE_UINT64, "string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES,
            "bool": _F.TYPE_BOOL, "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE}


def _field(msg: descriptor_pb2.DescriptorProto, name: str, number: int, type_: str,
           repeated: bool) -> None:
    f = msg.field.add(name=name, number=number,
                      label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_ in _SCALARS:
        f.type = _SCALARS[type_]
    else:
        f.type = _F.TYPE_MESSAGE
        f.type_name = f".{_PACKAGE}.{type_}"


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="fusecli/tf_saved_model.proto", package=_PACKAGE,
                                            syntax="proto3")
    for name, fields in _SCHEMA.items():
        msg = fd.message_type.add(name=name)
        if name in _ONEOFS:
            msg.oneof_decl.add(name=_ONEOFS[name])
        for field, number, type_, repeated in fields:
            if type_.startswith("map<"):
                key, value = type_[4:-1].split(",")
                entry_name = "".join(p.title() for p in field.split("_")) + "Entry"
                entry = msg.nested_type.add(name=entry_name)
                entry.options.map_entry = True
                _field(entry, "key", 1, key, False)
                _field(entry, "value", 2, value, False)
                msg.field.add(name=field, number=number, label=_F.LABEL_REPEATED, type=_F.TYPE_MESSAGE,
                                  type_name=f".{_PACKAGE}.{name}.{entry_name}")
            else:
                _field(msg, field, number, type_, repeated)
                if name in _ONEOFS:
                    msg.field[-1].oneof_index = 0
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def message_class(name: str):
    """The generated class of one message of the schema (``message_class("SavedModel")``)."""
    desc = _POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(_POOL).GetPrototype(desc)


SavedModel = message_class("SavedModel")
